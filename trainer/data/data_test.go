package data

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// tree writes files (path -> contents) under a new temporary directory.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	}
	return dir
}

func TestGlob(t *testing.T) {
	dir := tree(t, map[string]string{
		"a.go": "a", "b.txt": "b", "x/c.go": "c", "x/y/d.go": "d", "x/y/z/e.go": "e",
		"fmt/p.go": "p", "sort/q.go": "q", "strings/r.go": "r", "x/y/f.txt": "f",
	})
	require.NoError(t, os.Mkdir(filepath.Join(dir, "dir.go"), 0o755))
	require.NoError(t, os.Symlink(filepath.Join(dir, "a.go"), filepath.Join(dir, "x/link.go")))
	rel := func(ps ...string) []string {
		out := make([]string, len(ps))
		for i, p := range ps {
			out[i] = filepath.Join(dir, p)
		}
		return out
	}
	cases := []struct {
		pattern string
		want    []string
	}{
		{"*.go", rel("a.go")},
		{"**/*.go", rel("a.go", "fmt/p.go", "sort/q.go", "strings/r.go", "x/c.go", "x/link.go", "x/y/d.go", "x/y/z/e.go")},
		{"x/**/*.go", rel("x/c.go", "x/link.go", "x/y/d.go", "x/y/z/e.go")},
		{"x/**/z/*.go", rel("x/y/z/e.go")},
		{"x/**/**/d.go", rel("x/y/d.go")},
		{"x/**", rel("x/c.go", "x/link.go", "x/y/d.go", "x/y/f.txt", "x/y/z/e.go")},
		{"**/y/*", rel("x/y/d.go", "x/y/f.txt")},
		{"{fmt,strings,sort}/*.go", rel("fmt/p.go", "sort/q.go", "strings/r.go")},
		{"{fmt,x/{y,y/z}}/*.go", rel("fmt/p.go", "x/y/d.go", "x/y/z/e.go")},
		{"b.txt", rel("b.txt")},
		{"{a.go,b.txt,a.go}", rel("a.go", "b.txt")},
		{"nope.txt", nil},
		{"dir.go", nil},
		{"nope/**/*.go", nil},
		{"x/[cd].go", rel("x/c.go")},
	}
	for _, tc := range cases {
		t.Run(tc.pattern, func(t *testing.T) {
			got, err := Glob(filepath.Join(dir, tc.pattern))
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	_, err := Glob(filepath.Join(dir, "x/[/*.go"))
	require.ErrorContains(t, err, "syntax error in pattern")
}

func TestGlobRelative(t *testing.T) {
	dir := tree(t, map[string]string{"s/a.go": "a", "s/t/b.go": "b"})
	t.Chdir(dir)
	got, err := Glob("**/*.go")
	require.NoError(t, err)
	require.Equal(t, []string{"s/a.go", "s/t/b.go"}, got)
}

func TestExpandBraces(t *testing.T) {
	require.Equal(t, []string{"a"}, expandBraces("a"))
	require.Equal(t, []string{"xa", "xb"}, expandBraces("x{a,b}"))
	require.Equal(t, []string{"a1", "a2", "b1", "b2"}, expandBraces("{a,b}{1,2}"))
	require.Equal(t, []string{"x{a,b"}, expandBraces("x{a,b"))
	require.Equal(t, []string{"x{ab", "x{ac"}, expandBraces("x{a{b,c}"))
	require.Equal(t, []string{"x", "xa"}, expandBraces("x{,a}"))
}

func TestLoad(t *testing.T) {
	dir := tree(t, map[string]string{"b/2.txt": "two", "a/1.txt": "one", "c/3.md": "three", "e/empty.txt": ""})
	d, err := Load([]string{filepath.Join(dir, "**/*.txt"), filepath.Join(dir, "a/1.txt"), filepath.Join(dir, "c/*.md")})
	require.NoError(t, err)
	require.Equal(t, "one\ntwo\nthree\n", string(d.Bytes())[:len("one\ntwo\nthree\n")])
	require.Equal(t, "one\ntwo\nthree\n", string(d.Bytes()), "sorted by path, one file once, '\\n' between (an empty file adds one)")
	require.Equal(t, []string{filepath.Join(dir, "a/1.txt"), filepath.Join(dir, "b/2.txt"), filepath.Join(dir, "c/3.md"), filepath.Join(dir, "e/empty.txt")}, d.Files())
	require.Equal(t, 14, d.Len())

	_, err = Load([]string{filepath.Join(dir, "**/*.txt"), filepath.Join(dir, "*.rst")})
	require.EqualError(t, err, `data: load: no file matches "`+filepath.Join(dir, "*.rst")+`"`)
	_, err = Load([]string{filepath.Join(dir, "e/*.txt")})
	require.EqualError(t, err, `data: load: the files matching "`+filepath.Join(dir, "e/*.txt")+`" are empty`)
}

// The built-in corpus loads with no file on disk, alone (named, or no
// patterns at all) or with files; an unknown built-in name is an error.
func TestLoadBuiltin(t *testing.T) {
	for _, patterns := range [][]string{nil, {Builtin}, {Builtin, Builtin}} {
		d, err := Load(patterns)
		require.NoError(t, err)
		require.Equal(t, []string{Builtin}, d.Files())
		require.Greater(t, d.Len(), 300_000, "a few hundred KB")
		require.Contains(t, string(d.Bytes()), "package trainer")
	}
	dir := tree(t, map[string]string{"a.txt": "extra"})
	d, err := Load([]string{filepath.Join(dir, "a.txt"), Builtin})
	require.NoError(t, err)
	require.Equal(t, []string{filepath.Join(dir, "a.txt"), Builtin}, d.Files(), "sorted by name")
	require.True(t, bytes.HasPrefix(d.Bytes(), []byte("extra\npackage ")))
	_, err = Load([]string{"builtin:poems"})
	require.EqualError(t, err, `data: load: unknown built-in corpus "builtin:poems": the one built in is "builtin:corpus"`)
}

func TestSampleIsAPureFunction(t *testing.T) {
	text := make([]byte, 10_000)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range text {
		text[i] = byte(rng.Uint32())
	}
	d := New(text)
	window := 65
	a, b := make([]byte, window), make([]byte, window)
	offsets := map[int]bool{}
	for i := int64(0); i < 2000; i++ {
		d.Sample(1, i, a)
		// Asking in another order, from another Dataset, gives the same.
		New(slices.Clone(text)).Sample(1, i, b)
		require.Equal(t, a, b)
		off := bytes.Index(text, a)
		require.GreaterOrEqual(t, off, 0, "a window of the text")
		offsets[off] = true
	}
	// 2000 uniform draws over 9936 offsets hit about 1813 distinct ones.
	require.Greater(t, len(offsets), 1700, "offsets spread over the text")
	d.Sample(1, 5, a)
	d.Sample(2, 5, b)
	require.NotEqual(t, a, b, "the seed changes the order")
	d.Sample(1, 6, b)
	require.NotEqual(t, a, b)

	// Samples is Sample on consecutive indices.
	batch := make([]byte, 3*window+2)
	d.Samples(1, 40, window, batch)
	for k := range 3 {
		d.Sample(1, int64(40+k), a)
		require.Equal(t, a, batch[k*window:(k+1)*window])
	}
	require.Equal(t, []byte{0, 0}, batch[3*window:])
}

func TestSampleEdges(t *testing.T) {
	dst := make([]byte, 7)
	New([]byte("abc")).Sample(3, 9, dst)
	require.Contains(t, "abcabcabcabc", string(dst), "short text repeats")
	exact := make([]byte, 3)
	New([]byte("abc")).Sample(3, 9, exact)
	require.Equal(t, "abc", string(exact))
	dst = []byte("xyz")
	New(nil).Sample(1, 1, dst)
	require.Equal(t, []byte{0, 0, 0}, dst)
	New([]byte("abc")).Sample(1, -5, dst) // any index works
}

func TestSplit(t *testing.T) {
	text := bytes.Repeat([]byte("0123456789"), 100)
	train, val := New(text).Split(0.01)
	require.Equal(t, 990, train.Len())
	require.Equal(t, 10, val.Len())
	require.Equal(t, text[990:], val.Bytes())
	train, val = New([]byte("ab")).Split(0.01)
	require.Equal(t, 1, train.Len())
	require.Equal(t, 1, val.Len())
	train, val = New(text).Split(0)
	require.Equal(t, 1000, train.Len())
	require.Equal(t, 0, val.Len())
	// Appending to the training set cannot overwrite the validation set.
	_ = append(train.Bytes(), 'x')
	require.Equal(t, byte('0'), text[0])
}

func TestBatchUnionIsTheSameForAnyWorld(t *testing.T) {
	const global, micro = 48, 2
	for _, world := range []int{1, 2, 3, 4, 6, 8, 12, 24} {
		b, err := NewBatch(global, micro, world)
		require.NoError(t, err)
		for step := int64(0); step < 3; step++ {
			var got []int64
			for rank := range world {
				for m := range b.Accumulation() {
					first := b.MicroFirst(step, rank, m)
					for i := range int64(micro) {
						got = append(got, first+i)
					}
				}
			}
			slices.Sort(got)
			want := make([]int64, global)
			for i := range want {
				want[i] = b.First(step) + int64(i)
			}
			require.Equal(t, want, got, "world %d step %d", world, step)
		}
	}
	_, err := NewBatch(48, 2, 5)
	require.ErrorContains(t, err, "does not split")
	_, err = NewBatch(48, 0, 1)
	require.ErrorContains(t, err, "at least 1")
}

// BenchmarkLoadGoroot measures loading $GOROOT/src/**/*.go, the default
// data.files, and reports its size.
func BenchmarkLoadGoroot(b *testing.B) {
	root := os.Getenv("GOROOT")
	if root == "" {
		root = "/usr/local/go"
	}
	pattern := filepath.Join(root, "src/**/*.go")
	for b.Loop() {
		d, err := Load([]string{pattern})
		require.NoError(b, err)
		b.ReportMetric(float64(d.Len())/1e6, "MB")
		b.ReportMetric(float64(len(d.Files())), "files")
	}
}
