package slurm

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/gorun/gorun/internal/testutil"
)

// scontrol runs scontrol show hostnames and show hostlist standalone: scontrol needs only
// a slurm.conf to read (it does not talk to slurmctld for these), so it gets a minimal one
// and an environment without SLURM_* variables (show hostnames "" would read
// SLURM_JOB_NODELIST).
type scontrol struct {
	path string
	env  []string
}

func newScontrol(t *testing.T) scontrol {
	t.Helper()
	path, err := exec.LookPath("scontrol")
	if err != nil {
		testutil.SkipOrFail(t, "scontrol not found: install the Debian package slurm-client to compare with SLURM")
	}
	conf := filepath.Join(t.TempDir(), "slurm.conf")
	require.NoError(t, os.WriteFile(conf, []byte("ClusterName=gorun-test\nSlurmctldHost=localhost\n"), 0o644))
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLURM") {
			env = append(env, kv)
		}
	}
	s := scontrol{path: path, env: append(env, "SLURM_CONF="+conf)}
	hosts, ok, err := s.hostnames(context.Background(), "n[1-2]")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, []string{"n1", "n2"}, hosts, "scontrol does not work standalone")
	return s
}

func (s scontrol) run(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	// "--" ends scontrol's options, so expressions starting with "-" are arguments.
	cmd := exec.CommandContext(ctx, s.path, append([]string{"--"}, args...)...)
	cmd.Env = s.env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", "", fmt.Errorf("scontrol %q: %w: %s", args, err, errOut.String())
	}
	return out.String(), errOut.String(), nil
}

// hostnames returns scontrol's expansion of expr; ok is false when scontrol rejects it
// (it says so on stderr and still exits 0).
func (s scontrol) hostnames(ctx context.Context, expr string) (hosts []string, ok bool, err error) {
	out, errOut, err := s.run(ctx, "show", "hostnames", expr)
	if err != nil {
		return nil, false, err
	}
	if strings.Contains(errOut, "Invalid hostlist") {
		return nil, false, nil
	}
	if out == "" {
		return []string{}, true, nil
	}
	return strings.Split(strings.TrimSuffix(out, "\n"), "\n"), true, nil
}

func (s scontrol) hostlist(ctx context.Context, expr string) (string, error) {
	out, _, err := s.run(ctx, "show", "hostlist", expr)
	return strings.TrimSuffix(out, "\n"), err
}

// genHostlists returns n hostlist expressions from a fixed seed: prefixes, zero padding,
// several bracket groups, suffixes, commas and whitespace, and corrupted forms.
func genHostlists(n int) []string {
	r := rand.New(rand.NewPCG(2205, 8))
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	num := func(v int) string { return strings.Repeat("0", r.IntN(4)*r.IntN(2)) + fmt.Sprint(v) }
	group := func() string {
		var items []string
		for range 1 + r.IntN(3) {
			lo := r.IntN(120)
			switch r.IntN(30) {
			case 0, 1, 2, 3, 4, 5, 6:
				items = append(items, num(lo))
			case 7: // sometimes backwards
				items = append(items, num(lo)+"-"+num(max(lo-r.IntN(5), 0)))
			default:
				items = append(items, num(lo)+"-"+num(lo+r.IntN(12)))
			}
		}
		return "[" + strings.Join(items, ",") + "]"
	}
	word := func() string {
		w := pick("n", "node", "rack", "gpu-", "a1b", "x", "", "c0", "login", "ib0-")
		groups := r.IntN(4)
		if groups == 3 && r.IntN(2) == 0 {
			groups = 1
		}
		for g := range groups {
			if g > 0 {
				w += pick("", "-", "x", "-node", "n0")
			}
			w += group()
		}
		if r.IntN(10) == 0 {
			w += pick("-ib", "x", ".lan", "0")
		}
		if w == "" {
			w = "h"
		}
		return w
	}
	corrupt := func(s string) string {
		if s == "" {
			return s
		}
		i := r.IntN(len(s))
		switch r.IntN(3) {
		case 0:
			return s[:i] + s[i+1:]
		case 1:
			return s[:i] + pick("[", "]", "-", ",", "x", " ", "0", "+", "--", "[]") + s[i:]
		default:
			return s[:i]
		}
	}
	exprs := make([]string, 0, n)
	for len(exprs) < n {
		var b strings.Builder
		if r.IntN(8) == 0 {
			b.WriteString(pick(" ", ",", "\t"))
		}
		for k := range 1 + r.IntN(3) {
			if k > 0 {
				b.WriteString(pick(",", " ", "\t", ", ", " , ", ",,"))
			}
			b.WriteString(word())
		}
		if r.IntN(8) == 0 {
			b.WriteString(pick(" ", ",", "\t"))
		}
		e := b.String()
		if r.IntN(5) == 0 {
			e = corrupt(e)
		}
		exprs = append(exprs, e)
	}
	return exprs
}

// strictlyValid reports whether expr uses only the grammar ExpandHostlist promises to
// share with scontrol: balanced brackets, not nested, holding only N and N-M items.
func strictlyValid(expr string) bool {
	strictBrackets := regexp.MustCompile(`^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$`)
	open := -1
	for i := 0; i < len(expr); i++ {
		switch expr[i] {
		case '[':
			if open >= 0 {
				return false
			}
			open = i
		case ']':
			if open < 0 || !strictBrackets.MatchString(expr[open+1:i]) {
				return false
			}
			open = -1
		case '\n', '\r', '\v', '\f':
			return false
		}
	}
	return open < 0
}

// hasSuffix reports whether a word of expr has text after its last bracket group, the one
// extension over SLURM 22.05 that ExpandHostlist accepts and scontrol rejects.
func hasSuffix(expr string) bool {
	words, _ := splitWords(expr)
	for _, w := range words {
		if i := strings.LastIndexByte(w, ']'); i >= 0 && i < len(w)-1 {
			return true
		}
	}
	return false
}

// dropSwallowed removes from expr the words scontrol 22.05 silently drops: in a word with
// three or more bracket groups, hostlist.c's recursion over the groups before the last two
// ignores their errors (it takes the maximum of 0 and -1), so an invalid group there makes
// the whole word vanish instead of failing the hostlist.
func dropSwallowed(expr string) (kept string, dropped bool) {
	words, _ := splitWords(expr)
	var keep []string
	for _, w := range words {
		var groups []string
		for rest := w; ; {
			i, j := strings.IndexByte(rest, '['), strings.IndexByte(rest, ']')
			if i < 0 || j < i {
				break
			}
			groups = append(groups, rest[i+1:j])
			rest = rest[j+1:]
		}
		swallowed := false
		for i := 0; i < len(groups)-2; i++ {
			if _, err := ExpandHostlist("x[" + groups[i] + "]"); err != nil {
				swallowed = true
			}
		}
		if swallowed {
			dropped = true
			continue
		}
		keep = append(keep, w)
	}
	return strings.Join(keep, ","), dropped
}

func TestHostlistMatchesScontrol(t *testing.T) {
	sc := newScontrol(t)
	exprs := []string{
		// The tricky cases of the table tests, so their expectations are SLURM's.
		"", " ,\t, ", "n007", "n[1-3,7,10-11]", "n[08-11]", "n[8-011]", "n[1-010]", "n[01-3]",
		"n[1,01,001]", "n[9-10,011]", "n[3,1,2,1]", "[1-2]", "n[1-2],[3]", "rack[1-2]-node[01-02]",
		"n[1-2][3-4]", "n[1]-[2]", "a[0-1]b[0-1]c[0-1]", "a[0-1]b[0-1]c[0-1]d[0]", "node[1-2]-ib",
		"a[1-2]b[3]c", "a b,c", ",a,,b,", "n[1-2] , m", "a\tb", "n1-n3", "n18446744073709551615",
		"n[5-3]", "n[1-", "n[", "[", "n]", "n[1-2]]", "a]b[1,2]", "n[[1]]", "x[a[1]b[2]", "n[a-b]",
		"x[]", "n[1,,2]", "n[-3]", "n[3-]", "n[1-2-3]", "n[1--3]", "n[0x1]", "n[+1]", "n[1a-3]",
		"n[ 1-3]", "n[1, 3]", "n[1-65536]", "n[1-65537]", "a[1-65536,1]b[1]", "a[1-65535,1]b[1]",
	}
	exprs = append(exprs, genHostlists(400)...)

	type result struct {
		hosts    []string
		ok       bool
		compress string
	}
	results := make([]result, len(exprs))
	g, ctx := errgroup.WithContext(context.Background())
	g.SetLimit(2)
	for i, e := range exprs {
		g.Go(func() error {
			hosts, ok, err := sc.hostnames(ctx, e)
			if err != nil {
				return err
			}
			results[i] = result{hosts: hosts, ok: ok}
			if ok && len(hosts) > 0 && len(hosts) < 1000 && strictlyValid(e) {
				// Compress the host names, not e: scontrol compresses whatever ranges it parsed.
				results[i].compress, err = sc.hostlist(ctx, strings.Join(hosts, ","))
			}
			return err
		})
	}
	require.NoError(t, g.Wait())

	var same, bothRejected, suffixOnly, stricter, dropped int
	for i, e := range exprs {
		want := results[i]
		got, err := ExpandHostlist(e)
		switch {
		case want.ok && err == nil:
			require.Equal(t, want.hosts, got, "expression %q", e)
			if want.compress != "" {
				require.Equal(t, want.compress, CompressHostlist(got), "CompressHostlist of %q", e)
			}
			same++
		case !want.ok && err != nil:
			bothRejected++
		case !want.ok:
			require.True(t, hasSuffix(e), "scontrol rejects %q, ExpandHostlist gives %q", e, got)
			suffixOnly++
		case strictlyValid(e):
			// scontrol's only excuse: it drops words whose early groups are invalid.
			kept, anyDropped := dropSwallowed(e)
			require.True(t, anyDropped, "scontrol accepts %q as %q, ExpandHostlist: %v", e, want.hosts, err)
			got, err := ExpandHostlist(kept)
			require.NoError(t, err, "scontrol accepts %q as %q", e, want.hosts)
			require.Equal(t, want.hosts, got, "scontrol accepts %q without its words with invalid early groups", e)
			dropped++
		default:
			stricter++
		}
	}
	t.Logf("%d expressions: %d expanded the same, %d rejected by both, %d suffixes only we accept, "+
		"%d forms only scontrol accepts, %d with invalid early groups scontrol drops",
		len(exprs), same, bothRejected, suffixOnly, stricter, dropped)
	require.Greater(t, same, len(exprs)/2, "the generator should mostly make valid expressions")
}
