package data

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Glob returns the regular files matching pattern, sorted. Beyond
// filepath.Match's syntax, a path element "**" matches zero or more
// directories, and {a,b,c} alternatives are expanded first (they may
// nest). Symbolic links to files count as files; symbolic links to
// directories are not followed under "**". A pattern that matches nothing
// returns no files and no error; a malformed one is an error.
func Glob(pattern string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, p := range expandBraces(pattern) {
		files, err := glob(p)
		if err != nil {
			return nil, fmt.Errorf("data: glob %q: %w", pattern, err)
		}
		for _, f := range files {
			if !seen[f] {
				seen[f] = true
				out = append(out, f)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// glob matches one brace-free pattern.
func glob(pattern string) ([]string, error) {
	pattern = filepath.Clean(pattern)
	parts := strings.Split(filepath.ToSlash(pattern), "/")
	for _, p := range parts {
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("element %q: %w", p, err)
		}
	}
	i := slices.IndexFunc(parts, hasMeta)
	if i < 0 {
		if isFile(pattern) {
			return []string{pattern}, nil
		}
		return nil, nil
	}
	if !slices.Contains(parts[i:], "**") {
		matches, err := filepath.Glob(pattern)
		if err != nil {
			return nil, err
		}
		return slices.DeleteFunc(matches, func(m string) bool { return !isFile(m) }), nil
	}
	root := strings.Join(parts[:i], "/")
	switch {
	case root == "" && strings.HasPrefix(pattern, "/"):
		root = "/"
	case root == "":
		root = "."
	}
	rest := parts[i:]
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root && os.IsNotExist(err) {
				return filepath.SkipDir
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." || !matchParts(rest, strings.Split(filepath.ToSlash(rel), "/")) {
			return err
		}
		if d.Type().IsRegular() || (d.Type()&fs.ModeSymlink != 0 && isFile(p)) {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// matchParts matches path elements against pattern elements, where "**"
// stands for any number of elements.
func matchParts(pattern, name []string) bool {
	for len(pattern) > 0 {
		if pattern[0] == "**" {
			for len(pattern) > 1 && pattern[1] == "**" {
				pattern = pattern[1:]
			}
			for i := 0; i <= len(name); i++ {
				if matchParts(pattern[1:], name[i:]) {
					return true
				}
			}
			return false
		}
		if len(name) == 0 {
			return false
		}
		if ok, _ := path.Match(pattern[0], name[0]); !ok {
			return false
		}
		pattern, name = pattern[1:], name[1:]
	}
	return len(name) == 0
}

func hasMeta(s string) bool { return strings.ContainsAny(s, `*?[\`) }

// isFile reports whether p is (or links to) a regular file.
func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// expandBraces expands the first {a,b,...} of s (then the rest,
// recursively) into one pattern per alternative. An unclosed brace is
// literal.
func expandBraces(s string) []string {
	open := strings.IndexByte(s, '{')
	if open < 0 {
		return []string{s}
	}
	depth, start := 0, open+1
	var alts []string
	for i := open; i < len(s); i++ {
		switch s[i] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				alts = append(alts, s[start:i])
				var out []string
				for _, a := range alts {
					out = append(out, expandBraces(s[:open]+a+s[i+1:])...)
				}
				return out
			}
		case ',':
			if depth == 1 {
				alts = append(alts, s[start:i])
				start = i + 1
			}
		}
	}
	// Unclosed: keep the brace, expand what follows it.
	var out []string
	for _, rest := range expandBraces(s[open+1:]) {
		out = append(out, s[:open+1]+rest)
	}
	return out
}
