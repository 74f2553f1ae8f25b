package data

import (
	"fmt"
	"io"
	"math/bits"
	"os"
	"slices"
	"strings"
)

// maxBytes caps the text a Dataset loads: every rank holds all of it.
const maxBytes = 8 << 30

// Dataset is a byte string to draw training windows from. It is read-only
// after Load or New and safe for concurrent use.
type Dataset struct {
	text  []byte
	files []string
}

// Load reads every regular file matching the glob patterns (see Glob),
// sorted by path with duplicates dropped, and concatenates them with a
// '\n' between files. The pattern Builtin stands for the corpus built
// into gorun (listed as the file "builtin:corpus"), and no patterns at
// all mean it alone. A pattern that matches no file, an unknown
// "builtin:" name, and text that comes to zero bytes are errors that name
// the patterns.
func Load(patterns []string) (*Dataset, error) {
	if len(patterns) == 0 {
		patterns = []string{Builtin}
	}
	files, err := match(patterns)
	if err != nil {
		return nil, fmt.Errorf("data: load: %w", err)
	}
	var total int64
	for _, f := range files {
		size, err := sizeOf(f)
		if err != nil {
			return nil, fmt.Errorf("data: load: %w", err)
		}
		total += size + 1
		if total > maxBytes {
			return nil, fmt.Errorf("data: load: %s match more than %d GiB of text; every rank holds it all in memory: narrow the globs", strings.Join(quote(patterns), ", "), maxBytes>>30)
		}
	}
	text := make([]byte, 0, total)
	for i, f := range files {
		if i > 0 {
			text = append(text, '\n')
		}
		if builtin, ok := BuiltinText(f); ok {
			text = append(text, builtin...)
			continue
		}
		if text, err = appendFile(text, f); err != nil {
			return nil, fmt.Errorf("data: load: %w", err)
		}
	}
	if len(text) == 0 {
		return nil, fmt.Errorf("data: load: the files matching %s are empty", strings.Join(quote(patterns), ", "))
	}
	return &Dataset{text: text, files: files}, nil
}

// match lists the files (and built-in corpora) the patterns name, sorted,
// each once.
func match(patterns []string) ([]string, error) {
	seen := map[string]bool{}
	var files []string
	for _, p := range patterns {
		var matches []string
		switch {
		case IsBuiltin(p):
			if _, ok := BuiltinText(p); !ok {
				return nil, fmt.Errorf("unknown built-in corpus %q: the one built in is %q", p, Builtin)
			}
			matches = []string{p}
		default:
			var err error
			if matches, err = Glob(p); err != nil {
				return nil, err
			}
			if len(matches) == 0 {
				return nil, fmt.Errorf("no file matches %q", p)
			}
		}
		for _, m := range matches {
			if !seen[m] {
				seen[m] = true
				files = append(files, m)
			}
		}
	}
	slices.Sort(files)
	return files, nil
}

// sizeOf is the size in bytes of a file, or of a built-in corpus.
func sizeOf(file string) (int64, error) {
	if builtin, ok := BuiltinText(file); ok {
		return int64(len(builtin)), nil
	}
	st, err := os.Stat(file)
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// appendFile appends the contents of the file at path to buf, reading
// straight into buf's spare capacity.
func appendFile(buf []byte, path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return buf, err
	}
	defer f.Close()
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, 4096)
		}
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// New returns a Dataset over text (not copied: do not change it after).
func New(text []byte) *Dataset {
	return &Dataset{text: text}
}

// Len is the number of bytes in the dataset.
func (d *Dataset) Len() int { return len(d.text) }

// Bytes returns the text itself; the caller must not change it.
func (d *Dataset) Bytes() []byte { return d.text }

// Files lists the files Load read, in the order they are concatenated.
func (d *Dataset) Files() []string { return d.files }

// Split holds out the last fraction holdout of the bytes (at least one
// byte when holdout > 0, clamped to [0, 1]) as a validation set and
// returns the rest as the training set. Both share d's memory.
func (d *Dataset) Split(holdout float64) (train, val *Dataset) {
	holdout = min(max(holdout, 0), 1)
	n := len(d.text)
	v := int(float64(n) * holdout)
	if holdout > 0 && v == 0 && n > 1 {
		v = 1
	}
	cut := n - v
	return &Dataset{text: d.text[:cut:cut], files: d.files}, &Dataset{text: d.text[cut:], files: d.files}
}

// Sample fills dst (a window of context+1 bytes: inputs and next-byte
// targets) with the sample of global index under seed: the bytes from an
// offset drawn by a counter-based hash of (seed, index), so no state is
// shared between samples, ranks or restarts. When the dataset is shorter
// than dst the text repeats from its start; an empty dataset gives zeros.
func (d *Dataset) Sample(seed uint64, index int64, dst []byte) {
	n := len(d.text)
	if n == 0 {
		clear(dst)
		return
	}
	h := sampleHash(seed, index)
	if len(dst) <= n {
		off, _ := bits.Mul64(h, uint64(n-len(dst)+1))
		copy(dst, d.text[off:])
		return
	}
	off, _ := bits.Mul64(h, uint64(n))
	for i := 0; i < len(dst); {
		c := copy(dst[i:], d.text[off:])
		i += c
		off = 0
	}
}

// Samples fills dst with len(dst)/window consecutive samples of window
// bytes each, starting at global index first (any bytes after the last
// whole window are left alone).
func (d *Dataset) Samples(seed uint64, first int64, window int, dst []byte) {
	if window < 1 {
		return
	}
	for i := 0; i+window <= len(dst); i += window {
		d.Sample(seed, first+int64(i/window), dst[i:i+window])
	}
}

// sampleHash is a splitmix64-style hash of (seed, index): a counter-based
// generator, so sample i is the same whoever asks for it and in any order.
func sampleHash(seed uint64, index int64) uint64 {
	const golden = 0x9e3779b97f4a7c15
	return mix64(mix64(seed+golden) ^ (uint64(index) * golden))
}

func mix64(z uint64) uint64 {
	z ^= z >> 30
	z *= 0xbf58476d1ce4e5b9
	z ^= z >> 27
	z *= 0x94d049bb133111eb
	z ^= z >> 31
	return z
}

func quote(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}
