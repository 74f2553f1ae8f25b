package workerlog

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Std is a set of a worker's standard streams, as torchrun's --redirects and --tee name them.
type Std uint8

// The streams of a Std; Stdout|Stderr (3) is both, 0 is none.
const (
	Stdout Std = 1
	Stderr Std = 2
)

// Has reports whether s includes every stream of o.
func (s Std) Has(o Std) bool {
	return s&o == o
}

// String names the streams: "none", "stdout", "stderr" or "stdout+stderr".
func (s Std) String() string {
	switch s {
	case 0:
		return "none"
	case Stdout:
		return "stdout"
	case Stderr:
		return "stderr"
	case Stdout | Stderr:
		return "stdout+stderr"
	}
	return "Std(" + strconv.Itoa(int(s)) + ")"
}

// StdSpec says which streams of each local rank a setting applies to. The zero StdSpec applies to
// none. A StdSpec is immutable and safe to copy and share.
type StdSpec struct {
	all    Std         // for every local rank, when byRank is nil
	byRank map[int]Std // per local rank; ranks not listed have none
}

// AllRanks returns the StdSpec that applies s to every local rank, as ParseStd("3") does for both.
func AllRanks(s Std) StdSpec {
	return StdSpec{all: s & (Stdout | Stderr)}
}

// For returns the streams of localRank the spec applies to.
func (s StdSpec) For(localRank int) Std {
	if s.byRank != nil {
		return s.byRank[localRank]
	}
	return s.all
}

// IsZero reports whether the spec applies to no stream of any local rank.
func (s StdSpec) IsZero() bool {
	for _, std := range s.byRank {
		if std != 0 {
			return false
		}
	}
	return s.all == 0
}

// String returns the spec in the syntax ParseStd accepts: "3", or "0:1,1:2" sorted by local rank.
func (s StdSpec) String() string {
	if s.byRank == nil {
		return strconv.Itoa(int(s.all))
	}
	ranks := make([]int, 0, len(s.byRank))
	for r := range s.byRank {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	parts := make([]string, len(ranks))
	for i, r := range ranks {
		parts[i] = fmt.Sprintf("%d:%d", r, s.byRank[r])
	}
	return strings.Join(parts, ",")
}

// stdSyntax is what ParseStd accepts, for its errors.
const stdSyntax = `want 0 (none), 1 (stdout), 2 (stderr) or 3 (both) for every local rank, like "3", ` +
	`or local_rank:value pairs, like "0:1,1:2" (local ranks not listed: none)`

// ParseStd parses torchrun's --redirects and --tee syntax: one value for all local ranks, "0"
// (none), "1" (stdout), "2" (stderr) or "3" (both); or comma-separated local_rank:value pairs,
// "0:1,1:2", where local ranks not listed get none. Spaces around values are ignored and an empty
// string means none. On error it returns the zero StdSpec and an error that quotes s, names the
// bad part and says what is allowed.
func ParseStd(s string) (StdSpec, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return StdSpec{}, nil
	}
	if !strings.Contains(s, ":") {
		std, err := parseStdValue(s)
		if err != nil {
			return StdSpec{}, fmt.Errorf("workerlog: invalid std streams %q: %w; %s", s, err, stdSyntax)
		}
		return StdSpec{all: std}, nil
	}
	spec := StdSpec{byRank: make(map[int]Std)}
	for pair := range strings.SplitSeq(s, ",") {
		rankStr, valueStr, ok := strings.Cut(pair, ":")
		if !ok {
			return StdSpec{}, fmt.Errorf("workerlog: invalid std streams %q: %q is not local_rank:value; %s",
				s, strings.TrimSpace(pair), stdSyntax)
		}
		rank, err := parseLocalRank(rankStr)
		if err != nil {
			return StdSpec{}, fmt.Errorf("workerlog: invalid std streams %q: in %q: %w; %s",
				s, strings.TrimSpace(pair), err, stdSyntax)
		}
		std, err := parseStdValue(valueStr)
		if err != nil {
			return StdSpec{}, fmt.Errorf("workerlog: invalid std streams %q: in %q: %w; %s",
				s, strings.TrimSpace(pair), err, stdSyntax)
		}
		if _, dup := spec.byRank[rank]; dup {
			return StdSpec{}, fmt.Errorf("workerlog: invalid std streams %q: local rank %d is given twice; %s",
				s, rank, stdSyntax)
		}
		spec.byRank[rank] = std
	}
	return spec, nil
}

// parseStdValue parses "0" to "3".
func parseStdValue(s string) (Std, error) {
	s = strings.TrimSpace(s)
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > 3 {
		return 0, fmt.Errorf("value %q is not 0, 1, 2 or 3", s)
	}
	return Std(n), nil
}

// parseLocalRank parses a non-negative decimal local rank.
func parseLocalRank(s string) (int, error) {
	s = strings.TrimSpace(s)
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("local rank %q is not a non-negative integer", s)
	}
	return n, nil
}

// ParseLocalRanks parses torchrun's --local-ranks-filter syntax, comma-separated local ranks like
// "0,2", into sorted local ranks without duplicates. Spaces are ignored; an empty string gives nil,
// which means all local ranks. On error it returns nil and an error that quotes s, names the bad
// part and says what is allowed.
func ParseLocalRanks(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var ranks []int
	for part := range strings.SplitSeq(s, ",") {
		rank, err := parseLocalRank(part)
		if err != nil {
			return nil, fmt.Errorf("workerlog: invalid local ranks %q: %w; want comma-separated local ranks, like \"0,2\"", s, err)
		}
		ranks = append(ranks, rank)
	}
	slices.Sort(ranks)
	return slices.Compact(ranks), nil
}
