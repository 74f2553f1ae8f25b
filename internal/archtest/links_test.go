package archtest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

// TestDocLinks fails when a relative link of README.md, docs/*.md or
// examples/*/*.md names a file that does not exist, or an #anchor that no
// heading of its target makes (GitHub's anchors: slug).
func TestDocLinks(t *testing.T) {
	root := moduleRoot(t)
	docs := []string{filepath.Join(root, "README.md")}
	for _, pattern := range []string{"docs/*.md", "examples/*/*.md"} {
		found, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(pattern)))
		require.NoError(t, err)
		docs = append(docs, found...)
	}
	var broken []string
	for _, d := range docs {
		broken = append(broken, brokenLinks(d)...)
	}
	require.Empty(t, broken, "broken relative links")
}

// TestBrokenLinks: the checker itself finds a missing file, a missing
// anchor in another file and in the same one, and passes links in code,
// external links and good anchors.
func TestBrokenLinks(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
		return p
	}
	write("sub/b.md", "# B title\n\n## Failures: what `each` one does\n\n## Again\n\n## Again\n")
	write("img.png", "")
	for _, tc := range []struct {
		name, text string
		broken     []string
	}{
		{name: "good", text: "# Top\n[b](sub/b.md) [f](sub/b.md#failures-what-each-one-does) [again](sub/b.md#again-1) ![i](img.png) [top](#top) [dir](sub)\n"},
		{name: "external and mail", text: "[x](https://example.com/nope.md#zz) [m](mailto:a@b)\n"},
		{name: "in code", text: "`[x](missing.md)`\n\n    [y](missing.md)\n\n```\n[z](missing.md)\n```\n"},
		{name: "missing file", text: "see [x](missing.md).\n", broken: []string{"missing.md"}},
		{name: "missing anchor", text: "[x](sub/b.md#nope)\n", broken: []string{"sub/b.md#nope"}},
		{name: "missing own anchor", text: "# Top\n[x](#bottom)\n", broken: []string{"#bottom"}},
		{name: "third duplicate", text: "[x](sub/b.md#again-2)\n", broken: []string{"sub/b.md#again-2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := brokenLinks(write("a.md", tc.text))
			require.Len(t, got, len(tc.broken), "%q", got)
			for i, b := range tc.broken {
				require.Contains(t, got[i], b)
			}
		})
	}
}

// TestSlug: headings turn into GitHub's anchors.
func TestSlug(t *testing.T) {
	for _, tc := range []struct{ heading, want string }{
		{"Failures: what each one does", "failures-what-each-one-does"},
		{"torchrun recipes (`--rdzv-backend c10d`)", "torchrun-recipes---rdzv-backend-c10d"},
		{"In place: a worker or a node lost (`train.toml` jobs)", "in-place-a-worker-or-a-node-lost-traintoml-jobs"},
		{"Figures of Go tests and `gorun bench` (no bench script)", "figures-of-go-tests-and-gorun-bench-no-bench-script"},
		{"Memory copies (`[checkpoint] memory`)", "memory-copies-checkpoint-memory"},
		{"Where the time goes (`--profile`)", "where-the-time-goes---profile"},
		{"A [link](x.md) in it", "a-link-in-it"},
	} {
		require.Equal(t, tc.want, slug(tc.heading), tc.heading)
	}
}

var (
	linkRE    = regexp.MustCompile(`\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	mdLinkRE  = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	headingRE = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
)

// brokenLinks returns one line, "file:line: target: why", for each
// relative link of the Markdown file at path that does not resolve.
func brokenLinks(path string) []string {
	lines, err := proseLines(path)
	if err != nil {
		return []string{err.Error()}
	}
	var broken []string
	for n, line := range lines {
		for _, m := range linkRE.FindAllStringSubmatch(stripCode(line), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			if why := resolve(path, target); why != "" {
				broken = append(broken, fmt.Sprintf("%s:%d: %s: %s", path, n+1, target, why))
			}
		}
	}
	return broken
}

// resolve says why target, a link in the file at from, does not resolve;
// "" when it does.
func resolve(from, target string) string {
	file, anchor, _ := strings.Cut(target, "#")
	dest := from
	if file != "" {
		dest = filepath.Join(filepath.Dir(from), filepath.FromSlash(file))
		if _, err := os.Stat(dest); err != nil {
			return "no such file"
		}
	}
	if anchor == "" || !strings.HasSuffix(dest, ".md") {
		return ""
	}
	anchors, err := anchorsOf(dest)
	if err != nil {
		return err.Error()
	}
	if !anchors[anchor] {
		return "no heading makes this anchor"
	}
	return ""
}

// anchorsOf returns the anchors the headings of the Markdown file at path
// make: each heading's slug, and a repeated one with -1, -2, ... added.
func anchorsOf(path string) (map[string]bool, error) {
	lines, err := proseLines(path)
	if err != nil {
		return nil, err
	}
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, line := range lines {
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := slug(m[1])
		if k := seen[s]; k > 0 {
			anchors[fmt.Sprintf("%s-%d", s, k)] = true
		} else {
			anchors[s] = true
		}
		seen[s]++
	}
	return anchors, nil
}

// slug is GitHub's anchor of a heading: its text as rendered (a link's
// text, code without its backticks), lower case, with everything but
// letters, digits, marks, '_', '-' and spaces removed and each space a '-'.
func slug(heading string) string {
	text := strings.ReplaceAll(mdLinkRE.ReplaceAllString(heading, "$1"), "`", "")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// proseLines returns the lines of the Markdown file at path with the
// code blocks (fenced, or indented by four spaces or a tab) blanked, so
// that line numbers stay those of the file.
func proseLines(path string) ([]string, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(text), "\n")
	fence := ""
	for i, line := range lines {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			lines[i] = ""
		case strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~"):
			fence = trimmed[:3]
			lines[i] = ""
		case strings.HasPrefix(line, "    ") || strings.HasPrefix(line, "\t"):
			lines[i] = ""
		}
	}
	return lines, nil
}

// stripCode removes the code spans of a line: a run of backticks up to the
// next run of as many (a run with no match stays, as Markdown keeps it).
func stripCode(line string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(line, '`')
		if i < 0 {
			b.WriteString(line)
			return b.String()
		}
		n := i
		for n < len(line) && line[n] == '`' {
			n++
		}
		run := line[i:n]
		end := -1
		for j := n; j < len(line); {
			k := strings.Index(line[j:], run)
			if k < 0 {
				break
			}
			k += j
			if k+len(run) == len(line) || line[k+len(run)] != '`' {
				end = k
				break
			}
			for k < len(line) && line[k] == '`' {
				k++
			}
			j = k
		}
		if end < 0 {
			b.WriteString(line[:n])
			line = line[n:]
			continue
		}
		b.WriteString(line[:i])
		line = line[end+len(run):]
	}
}
