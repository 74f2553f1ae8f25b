package archtest

import (
	"bytes"
	"fmt"
	"go/build"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The Layout section of docs/design.md lies between these two lines; what
// is between them is generated (layoutTable) and nothing else.
const (
	layoutBegin = "<!-- layout begin: generated from each package's doc comment by `GORUN_UPDATE_LAYOUT=1 go test ./internal/archtest -run TestLayout`; do not edit -->"
	layoutEnd   = "<!-- layout end -->"
	layoutDoc   = "docs/design.md"
	updateEnv   = "GORUN_UPDATE_LAYOUT"
)

// TestLayout fails when docs/design.md's Layout is not the table of
// today's packages and the first sentence of each one's doc comment, or
// when a package has no doc comment. With GORUN_UPDATE_LAYOUT=1 it writes
// the table into docs/design.md instead.
func TestLayout(t *testing.T) {
	root := moduleRoot(t)
	pkgs, err := packages(root)
	require.NoError(t, err)
	var missing []string
	for _, p := range pkgs {
		if p.synopsis == "" {
			missing = append(missing, p.dir)
		}
	}
	require.Empty(t, missing, "packages without a doc comment: add a doc.go whose first sentence says what the package is")

	path := filepath.Join(root, layoutDoc)
	text, err := os.ReadFile(path)
	require.NoError(t, err)
	want := layoutTable(pkgs)
	got, err := spliceLayout(string(text), want)
	require.NoError(t, err)
	if os.Getenv(updateEnv) == "1" {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	if got != string(text) {
		t.Fatalf("%s's Layout is out of date; regenerate it with\n\n\t%s=1 go test ./internal/archtest -run TestLayout\n\n%s",
			layoutDoc, updateEnv, lineDiff(string(text), got))
	}
}

// lineDiff lists the lines of was that now lacks ("-") and the lines of
// now that was lacks ("+"), in their order.
func lineDiff(was, now string) string {
	a, b := strings.Split(was, "\n"), strings.Split(now, "\n")
	var out strings.Builder
	for _, l := range a {
		if !slices.Contains(b, l) {
			fmt.Fprintf(&out, "- %s\n", l)
		}
	}
	for _, l := range b {
		if !slices.Contains(a, l) {
			fmt.Fprintf(&out, "+ %s\n", l)
		}
	}
	return out.String()
}

// TestSpliceLayout: the table replaces exactly what lies between the
// markers, and a document without both markers, in order, is an error.
func TestSpliceLayout(t *testing.T) {
	for _, tc := range []struct {
		name, doc, table, want, err string
	}{
		{name: "replaces", doc: "a\n" + layoutBegin + "\nold\n" + layoutEnd + "\nb\n", table: "new\n",
			want: "a\n" + layoutBegin + "\nnew\n" + layoutEnd + "\nb\n"},
		{name: "empty before", doc: layoutBegin + "\n" + layoutEnd + "\n", table: "t\n",
			want: layoutBegin + "\nt\n" + layoutEnd + "\n"},
		{name: "no begin", doc: "x\n" + layoutEnd + "\n", table: "t\n", err: "no line"},
		{name: "no end", doc: layoutBegin + "\nx\n", table: "t\n", err: "no line"},
		{name: "end first", doc: "x\n" + layoutEnd + "\n" + layoutBegin + "\n", table: "t\n", err: "before"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := spliceLayout(tc.doc, tc.table)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// docPkg is one package of the module: its directory relative to the module
// root (slash-separated) and the first sentence of its doc comment.
type docPkg struct{ dir, synopsis string }

// packages lists every package under root that builds here (build
// constraints as go build applies them; a directory holding only test
// files is a package of its tests), in path order. Directories named
// testdata, or starting with . or _, are skipped, as the go command skips
// them. A package's doc comment is the one of its files that has one
// (doc.go first); a non-test file's wins over a test file's.
func packages(root string) ([]docPkg, error) {
	var out []docPkg
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
			return filepath.SkipDir
		}
		syn, ok, err := synopsisOf(path)
		if err != nil || !ok {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		out = append(out, docPkg{dir: filepath.ToSlash(rel), synopsis: syn})
		return nil
	})
	slices.SortFunc(out, func(a, b docPkg) int { return strings.Compare(a.dir, b.dir) })
	return out, err
}

// synopsisOf returns the first sentence of the doc comment of the package
// in dir, and whether dir holds a package at all.
func synopsisOf(dir string) (string, bool, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", false, err
	}
	var files []string
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") {
			continue
		}
		if ok, err := build.Default.MatchFile(dir, e.Name()); err != nil || !ok {
			continue
		}
		files = append(files, e.Name())
	}
	if len(files) == 0 {
		return "", false, nil
	}
	// doc.go first, then non-test files, then test files.
	rank := func(n string) int {
		switch {
		case n == "doc.go":
			return 0
		case !strings.HasSuffix(n, "_test.go"):
			return 1
		}
		return 2
	}
	slices.SortStableFunc(files, func(a, b string) int { return rank(a) - rank(b) })
	fset := token.NewFileSet()
	for _, n := range files {
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return "", true, err
		}
		if f.Doc != nil {
			return new(doc.Package).Synopsis(f.Doc.Text()), true, nil
		}
	}
	return "", true, nil
}

// layoutTable renders pkgs as the Markdown table of the Layout section.
func layoutTable(pkgs []docPkg) string {
	var b bytes.Buffer
	b.WriteString("| package | what it is (the first sentence of its doc comment) |\n|---|---|\n")
	for _, p := range pkgs {
		fmt.Fprintf(&b, "| `%s` | %s |\n", p.dir, strings.ReplaceAll(p.synopsis, "|", `\|`))
	}
	return b.String()
}

// spliceLayout returns text with the lines between layoutBegin and
// layoutEnd replaced by table; it fails when either marker line is
// missing or they are out of order.
func spliceLayout(text, table string) (string, error) {
	i := strings.Index(text, layoutBegin+"\n")
	j := strings.Index(text, "\n"+layoutEnd)
	if i < 0 || j < 0 {
		return "", fmt.Errorf("%s: no line %q followed, later, by a line %q", layoutDoc, layoutBegin, layoutEnd)
	}
	start := i + len(layoutBegin) + 1
	if j+1 < start {
		return "", fmt.Errorf("%s: %q comes before %q", layoutDoc, layoutEnd, layoutBegin)
	}
	return text[:start] + table + text[j+1:], nil
}

// moduleRoot is the directory of the go.mod above the test's directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, dir, parent, "no go.mod above the test's directory")
		dir = parent
	}
}
