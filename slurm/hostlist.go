package slurm

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// MaxHosts is the most hosts ExpandHostlist returns for one expression. SLURM has no such
// total limit (it only limits single ranges and bracket groups, as ExpandHostlist does too);
// this one keeps a typo like "a[1-65536]b[1-65536]" from allocating gigabytes.
const MaxHosts = 1 << 20

// maxHostBytes limits the total length of the host names ExpandHostlist returns, since
// padding widths are unlimited: n[0000...0001-65536] with a long run of zeros is short to
// write and huge to expand.
const maxHostBytes = 64 << 20

const (
	// maxRangeHosts is SLURM 22.05's MAX_RANGE: the most hosts in one "lo-hi" range.
	maxRangeHosts = 64 * 1024
	// maxGroupHosts is SLURM 22.05's MAX_PREFIX_CNT: the most hosts in one bracket group
	// that is not the last group of its word.
	maxGroupHosts = 64 * 1024
)

// HostlistError is the error ExpandHostlist returns for an expression it rejects.
type HostlistError struct {
	Expr   string // the whole expression given to ExpandHostlist
	Reason string // what is wrong, e.g. "range start 5 > end 3"
}

// Error returns `slurm: hostlist "EXPR": REASON`.
func (e *HostlistError) Error() string {
	return fmt.Sprintf("slurm: hostlist %q: %s", e.Expr, e.Reason)
}

// ExpandHostlist expands a SLURM hostlist expression such as "rack[1-2]-node[01-02],login1"
// into host names, in SLURM's order, without sorting and without removing duplicates. An
// empty expression (or one of separators only) gives an empty, non-nil list. On any error
// it returns a nil list and a *HostlistError.
//
// The grammar is that of SLURM 22.05's hostlist.c (scontrol show hostnames):
//
//   - Words are separated by commas and whitespace outside brackets; empty words vanish.
//   - A word without brackets is one host, taken verbatim ("n007" stays "n007").
//   - A bracket group holds comma-separated numbers N and ranges N-M (decimal, N <= M).
//     Each number is zero-padded to the length of N as written: n[08-11] is n08 n09 n10
//     n11, n[8-011] is n8..n11 and n[1-010] is n1..n10, as scontrol does.
//   - A word may hold several groups; they form a cartesian product in SLURM's order: the
//     last group varies fastest, then the first, the second, ... up to the one before the
//     last, which varies slowest. For one or two groups that is plain lexicographic order
//     (rack[1-2]-node[01-02] is rack1-node01 rack1-node02 rack2-node01 rack2-node02);
//     a[0-1]b[0-1]c[0-1] is a0b0c0 a0b0c1 a1b0c0 a1b0c1 a0b1c0 ...
//   - Limits as in SLURM 22.05: at most 65536 hosts in one range, and at most 65536 hosts
//     in a group that is not the last of its word. On top of that, at most MaxHosts hosts
//     and 64 MiB of host names in all.
//
// Where it knowingly differs from scontrol 22.05:
//
//   - Text after the last group of a word is a suffix of every host: node[1-2]-ib is
//     node1-ib node2-ib (SLURM 22.05 rejects it; newer SLURM accepts it).
//   - Newline, carriage return, vertical tab and form feed separate words too (scontrol
//     keeps them inside host names), so the output of scontrol show hostnames expands.
//   - Unbalanced or nested brackets are errors; scontrol turns "n[1-" into the host "n]"
//     and takes "n]" as a host name.
//   - Inside brackets only digits, commas and one "-" per range are allowed; scontrol's
//     strtoul also takes "n[ 1-3]" (n01 n02 n03, the space counts as padding), "n[+1]",
//     "n[1a-3]" and "n[3-]".
//   - A host name outside brackets whose number does not fit 64 bits is kept verbatim;
//     scontrol prints 18446744073709551615 instead.
//   - In a word with three or more groups, an invalid group before the last two (n[5-3]
//     in a[0-1]n[5-3]b[1]c[2]) is an error; scontrol silently drops the whole word.
func ExpandHostlist(expr string) ([]string, error) {
	fail := func(format string, args ...any) ([]string, error) {
		return nil, &HostlistError{Expr: expr, Reason: fmt.Sprintf(format, args...)}
	}
	words, reason := splitWords(expr)
	if reason != "" {
		return fail("%s", reason)
	}
	parsed := make([]word, 0, len(words))
	total, bytes := 0, 0
	for _, w := range words {
		pw, reason := parseWord(w, MaxHosts-total)
		if reason != "" {
			return fail("%s", reason)
		}
		total += pw.count
		if bytes += pw.bytes; bytes > maxHostBytes {
			return fail("expands to more than %d MiB of host names, the limit of this package", maxHostBytes>>20)
		}
		parsed = append(parsed, pw)
	}
	hosts := make([]string, 0, total)
	for _, pw := range parsed {
		hosts = pw.expand(hosts)
	}
	return hosts, nil
}

// isSep reports whether c separates words outside brackets.
func isSep(c byte) bool {
	switch c {
	case ',', ' ', '\t', '\n', '\r', '\v', '\f':
		return true
	}
	return false
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// splitWords splits expr at separators outside brackets and checks that the brackets pair
// up without nesting and hold no whitespace. It returns a reason when they do not.
func splitWords(expr string) (words []string, reason string) {
	start, open := -1, -1 // start of the current word; offset of the '[' we are in
	for i := 0; i < len(expr); i++ {
		c := expr[i]
		switch {
		case c == '[':
			if open >= 0 {
				return nil, fmt.Sprintf(`nested "[" at offset %d`, i)
			}
			open = i
		case c == ']':
			if open < 0 {
				return nil, fmt.Sprintf(`"]" without "[" at offset %d`, i)
			}
			open = -1
		case isSep(c) && open >= 0 && c != ',':
			return nil, fmt.Sprintf("whitespace inside brackets at offset %d", i)
		case isSep(c) && open < 0:
			if start >= 0 {
				words = append(words, expr[start:i])
				start = -1
			}
			continue
		}
		if start < 0 {
			start = i
		}
	}
	if open >= 0 {
		return nil, fmt.Sprintf(`"[" at offset %d is never closed`, open)
	}
	if start >= 0 {
		words = append(words, expr[start:])
	}
	return words, ""
}

// numRange is one N or N-M of a bracket group; width is the length of N as written.
type numRange struct {
	lo, hi uint64
	width  int
}

// word is one parsed word: lits[0] groups[0] lits[1] ... groups[n-1] lits[n].
type word struct {
	lits   []string
	groups [][]numRange
	count  int // hosts it expands to
	bytes  int // at most this many bytes of host names
}

// parseWord parses a word whose brackets splitWords has checked; budget is how many hosts
// it may still expand to.
func parseWord(w string, budget int) (word, string) {
	var pw word
	rest := w
	for {
		i := strings.IndexByte(rest, '[')
		if i < 0 {
			pw.lits = append(pw.lits, rest)
			break
		}
		j := strings.IndexByte(rest, ']') // after i: brackets are balanced and not nested
		pw.lits = append(pw.lits, rest[:i])
		ranges, reason := parseRanges(rest[i+1 : j])
		if reason != "" {
			return word{}, reason
		}
		pw.groups = append(pw.groups, ranges)
		rest = rest[j+1:]
	}
	count := uint64(1)
	for g, ranges := range pw.groups {
		var n uint64
		for _, r := range ranges {
			n += r.hi - r.lo + 1 // at most maxRangeHosts each
		}
		if g < len(pw.groups)-1 && n > maxGroupHosts {
			return word{}, fmt.Sprintf("%d hosts in bracket group %d of %q; SLURM allows at most %d in a group before the last",
				n, g+1, w, maxGroupHosts)
		}
		if n > uint64(budget) || count*n > uint64(budget) { // count <= budget, n <= budget: no overflow
			return word{}, fmt.Sprintf("expands to more than %d hosts, the limit of this package", MaxHosts)
		}
		count *= n
	}
	if count > uint64(budget) {
		return word{}, fmt.Sprintf("expands to more than %d hosts, the limit of this package", MaxHosts)
	}
	pw.count = int(count)
	// Every name has the literals and, from each group, at most its longest number.
	nameLen := 0
	for _, l := range pw.lits {
		nameLen += len(l)
	}
	for _, ranges := range pw.groups {
		longest := 0
		for _, r := range ranges {
			longest = max(longest, r.width, len(strconv.FormatUint(r.hi, 10)))
		}
		nameLen += longest
	}
	pw.bytes = pw.count * nameLen // < 2^20 * (len(w) + 20 * groups)
	return pw, ""
}

// parseRanges parses the inside of a bracket group: "1-3,7,10-11".
func parseRanges(s string) ([]numRange, string) {
	if s == "" {
		return nil, `empty brackets "[]"`
	}
	var ranges []numRange
	for part := range strings.SplitSeq(s, ",") {
		if part == "" {
			return nil, fmt.Sprintf("empty range in [%s]", s)
		}
		loS, hiS, isRange := strings.Cut(part, "-")
		if !isRange {
			hiS = loS
		}
		if !allDigits(loS) || !allDigits(hiS) {
			return nil, fmt.Sprintf("invalid range %q in [%s]: want N or N-M with decimal numbers N and M", part, s)
		}
		lo, err := strconv.ParseUint(loS, 10, 64)
		if err != nil {
			return nil, fmt.Sprintf("number %s in [%s] is too large", loS, s)
		}
		hi, err := strconv.ParseUint(hiS, 10, 64)
		if err != nil {
			return nil, fmt.Sprintf("number %s in [%s] is too large", hiS, s)
		}
		if lo > hi {
			return nil, fmt.Sprintf("range start %d > end %d", lo, hi)
		}
		if hi-lo >= maxRangeHosts {
			return nil, fmt.Sprintf("range %s has more than %d hosts, SLURM's limit for one range", part, maxRangeHosts)
		}
		ranges = append(ranges, numRange{lo: lo, hi: hi, width: len(loS)})
	}
	return ranges, ""
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

// pad formats v in decimal, zero-padded to width, like printf("%0*lu", width, v).
func pad(v uint64, width int) string {
	s := strconv.FormatUint(v, 10)
	if len(s) < width {
		s = strings.Repeat("0", width-len(s)) + s
	}
	return s
}

// expand appends the word's hosts to hosts in SLURM's order.
func (pw word) expand(hosts []string) []string {
	n := len(pw.groups)
	if n == 0 {
		return append(hosts, pw.lits[0])
	}
	nums := make([][]string, n)
	for g, ranges := range pw.groups {
		for _, r := range ranges {
			for v := r.lo; ; v++ {
				nums[g] = append(nums[g], pad(v, r.width))
				if v == r.hi { // not v <= r.hi: r.hi may be MaxUint64
					break
				}
			}
		}
	}
	// order lists the groups from slowest to fastest varying. SLURM's hostlist.c peels
	// the groups before the last one off from the right, each in an outer loop, and
	// pushes the last group innermost.
	order := make([]int, 0, n)
	for g := n - 2; g >= 0; g-- {
		order = append(order, g)
	}
	order = append(order, n-1)

	idx := make([]int, n)
	var b strings.Builder
	for {
		b.Reset()
		for g := 0; g < n; g++ {
			b.WriteString(pw.lits[g])
			b.WriteString(nums[g][idx[g]])
		}
		b.WriteString(pw.lits[n])
		hosts = append(hosts, b.String())
		k := len(order) - 1
		for ; k >= 0; k-- {
			g := order[k]
			idx[g]++
			if idx[g] < len(nums[g]) {
				break
			}
			idx[g] = 0
		}
		if k < 0 {
			return hosts
		}
	}
}

// CompressHostlist is the inverse of ExpandHostlist, like scontrol show hostlist: it never
// reorders, it only merges runs of adjacent hosts. A host whose name ends in a decimal
// number joins the run of the host just before it when both have the same prefix (the
// name before the trailing digits), its number is one more, and the zero padding agrees
// (n08,n09,n10 is n[08-10]; n9,n10 is n[9-10]; n9,n010 stay apart). Adjacent runs with the
// same prefix share one bracket group (n[1-3,7,01]). A run of one host that is alone in its
// group is written without brackets, and a host without a trailing number (or with one
// longer than 64 bits) is written as is. Words are joined with commas; no hosts give "".
//
// For host names that are not empty and hold no brackets, commas or whitespace,
// ExpandHostlist(CompressHostlist(hosts)) returns hosts exactly, in the same order and with
// any duplicates (n1,n1 is n[1,1]). Other names are written verbatim and do not survive
// the round trip.
func CompressHostlist(hosts []string) string {
	runs := make([]hostRun, 0, len(hosts))
	for _, h := range hosts {
		r := splitHost(h)
		if n := len(runs); n > 0 && runs[n-1].extend(r) {
			continue
		}
		runs = append(runs, r)
	}
	var b strings.Builder
	for i := 0; i < len(runs); {
		if i > 0 {
			b.WriteByte(',')
		}
		r := runs[i]
		j := i + 1
		for j < len(runs) && r.numeric && runs[j].numeric && runs[j].prefix == r.prefix {
			j++
		}
		b.WriteString(r.prefix)
		if !r.numeric {
			i = j
			continue
		}
		if j == i+1 && r.lo == r.hi {
			b.WriteString(pad(r.lo, r.width))
			i = j
			continue
		}
		b.WriteByte('[')
		for k := i; k < j; k++ {
			if k > i {
				b.WriteByte(',')
			}
			b.WriteString(pad(runs[k].lo, runs[k].width))
			if runs[k].hi != runs[k].lo {
				b.WriteByte('-')
				b.WriteString(pad(runs[k].hi, runs[k].width))
			}
		}
		b.WriteByte(']')
		i = j
	}
	return b.String()
}

// hostRun is a run of hosts prefix+pad(lo, width) ... prefix+pad(hi, width), or one host
// named prefix when numeric is false.
type hostRun struct {
	prefix  string
	lo, hi  uint64
	width   int
	numeric bool
}

func splitHost(h string) hostRun {
	i := len(h)
	for i > 0 && isDigit(h[i-1]) {
		i--
	}
	v, err := strconv.ParseUint(h[i:], 10, 64)
	if i == len(h) || err != nil {
		return hostRun{prefix: h}
	}
	return hostRun{prefix: h[:i], lo: v, hi: v, width: len(h) - i, numeric: true}
}

// extend appends the single host n to run r if it continues it, and reports whether it did.
func (r *hostRun) extend(n hostRun) bool {
	if !r.numeric || !n.numeric || r.prefix != n.prefix || r.hi == math.MaxUint64 || r.hi+1 != n.lo {
		return false
	}
	if r.width == n.width {
		r.hi = n.lo
		return true
	}
	// Different widths still merge when one of them formats both numbers unchanged, the
	// rule of hostlist.c's _width_equiv: if r.lo's padding is the same under n's width,
	// every number of r is unpadded under both and r takes n's width; else if n's padding
	// is the same under r's width, r keeps its width.
	switch {
	case padLen(r.lo, r.width) == padLen(r.lo, n.width):
		r.width = n.width
	case padLen(n.lo, r.width) == padLen(n.lo, n.width):
	default:
		return false
	}
	r.hi = n.lo
	return true
}

// padLen is how many zeros pad adds to v for width.
func padLen(v uint64, width int) int {
	return max(width-len(strconv.FormatUint(v, 10)), 0)
}
