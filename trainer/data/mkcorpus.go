//go:build ignore

// mkcorpus writes corpus.txt, the text built into gorun (data.Builtin): the
// non-test, hand-written Go source of gorun's own trainer, checkpoint and
// slurm packages, files in path order with a '\n' between them. Run it
// from this directory with `go generate`; the output depends only on
// those files.
package main

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// roots are the module's directories the corpus is made of.
var roots = []string{"trainer", "checkpoint", "slurm"}

func main() {
	if err := run(filepath.Join("..", ".."), "corpus.txt"); err != nil {
		fmt.Fprintln(os.Stderr, "mkcorpus:", err)
		os.Exit(1)
	}
}

// run concatenates the corpus files under module into out.
func run(module, out string) error {
	var files []string
	for _, root := range roots {
		err := filepath.WalkDir(filepath.Join(module, root), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") || strings.HasSuffix(p, "mkcorpus.go") {
				return err
			}
			files = append(files, p)
			return nil
		})
		if err != nil {
			return err
		}
	}
	slices.Sort(files)
	var text bytes.Buffer
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte("// Code generated")) {
			continue
		}
		if text.Len() > 0 {
			text.WriteByte('\n')
		}
		text.Write(b)
	}
	return os.WriteFile(out, text.Bytes(), 0o644)
}
