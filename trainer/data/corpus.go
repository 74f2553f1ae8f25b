package data

import (
	_ "embed"
	"strings"
)

// Builtin is the data.files name of the corpus built into gorun, so that a
// train.toml runs on a node with no text files of its own (no Go
// installed): about 380 KB of Go source, gorun's own trainer, checkpoint
// and slurm packages (see mkcorpus.go; same license as gorun).
const Builtin = "builtin:corpus"

// BuiltinPrefix begins every data.files name that means a built-in corpus
// rather than a file or glob.
const BuiltinPrefix = "builtin:"

//go:generate go run mkcorpus.go

//go:embed corpus.txt
var builtinCorpus []byte

// IsBuiltin reports whether the data.files entry pattern names a built-in
// corpus (known or not) rather than files.
func IsBuiltin(pattern string) bool { return strings.HasPrefix(pattern, BuiltinPrefix) }

// BuiltinText returns the text of the built-in corpus called name, and
// false when gorun has no corpus of that name. The caller must not change
// the text.
func BuiltinText(name string) ([]byte, bool) {
	if name != Builtin {
		return nil, false
	}
	return builtinCorpus, true
}
