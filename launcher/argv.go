package launcher

import (
	"slices"
	"strings"
)

// ArgFlag is one launch flag as ExpandArgv sees it: its names without
// dashes ("nproc-per-node", "nproc_per_node", "m") and whether it takes
// a value.
type ArgFlag struct {
	Names []string
	Value bool
}

// torchrunFlags are the long flags of torchrun's parser (PyTorch 2.10's
// torch/distributed/run.py, dash spelling; each also takes underscores)
// and argparse's --help. An abbreviation that names one of these and one
// of gorun's own flags means torchrun's, as it does under torchrun.
var torchrunFlags = []string{
	"nnodes", "nproc-per-node", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf", "standalone",
	"max-restarts", "monitor-interval", "start-method", "event-log-handler", "role", "module", "no-python",
	"run-path", "log-dir", "redirects", "tee", "local-ranks-filter", "node-rank", "master-addr", "master-port",
	"local-addr", "logs-specs", "numa-binding", "signals-to-handle", "shutdown-timeout", "virtual-local-rank",
	"duplicate-stdout-filters", "duplicate-stderr-filters", "help",
}

// Argv is a launch command line after ExpandArgv.
type Argv struct {
	// Args are the arguments with every abbreviated long flag written out.
	Args []string
	// Entry is the index in Args of the first positional argument (the
	// entrypoint, or a command's name); len(Args) when there is none.
	Entry int
	// Dashed says a "--" ended the flags: it is Args[Entry-1].
	Dashed bool
}

// ExpandArgv reads the flags at the start of args as torchrun's argparse
// does and writes each abbreviation of a long flag out in full: any
// unambiguous prefix of a flag's name is that flag (--nproc=2 is
// --nproc-per-node=2, --redirect 3 is --redirects 3). A prefix that
// matches only spellings of one flag (--nproc matches --nproc-per-node
// and --nproc_per_node) names that flag; one that matches several flags
// names torchrun's flag if exactly one of them is torchrun's, and is
// otherwise an error that names the candidates, as argparse's. Unknown
// flags are left for the flag parser to refuse. ExpandArgv stops at the
// first positional argument or "--"; what follows is the entrypoint's.
func ExpandArgv(args []string, flags []ArgFlag) (Argv, error) {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			entry := len(out) + 1
			return Argv{Args: append(out, args[i:]...), Entry: entry, Dashed: true}, nil
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			entry := len(out)
			return Argv{Args: append(out, args[i:]...), Entry: entry}, nil
		}
		dashes := "-"
		if strings.HasPrefix(a, "--") {
			dashes = "--"
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(a, dashes), "=")
		f, full, err := findFlag(name, dashes, flags)
		if err != nil {
			return Argv{}, err
		}
		if f == nil { // unknown: the flag parser says so
			out = append(out, a)
			continue
		}
		if hasValue {
			out = append(out, dashes+full+"="+value)
			continue
		}
		out = append(out, dashes+full)
		if f.Value && i+1 < len(args) {
			i++
			out = append(out, args[i])
		}
	}
	return Argv{Args: out, Entry: len(out)}, nil
}

// findFlag finds the flag that name (as written after dashes) means: an
// exact name, else, for a long flag (two dashes, or one and a name of more
// than one letter, which Go's flag package also takes), an abbreviation.
// It returns the flag and the name to write, or nil when none matches.
func findFlag(name, dashes string, flags []ArgFlag) (*ArgFlag, string, error) {
	for i := range flags {
		if slices.Contains(flags[i].Names, name) {
			return &flags[i], name, nil
		}
	}
	if dashes != "--" || name == "" {
		return nil, "", nil // argparse abbreviates long flags only
	}
	type match struct {
		flag *ArgFlag
		name string
	}
	var matches []match
	for i := range flags {
		for _, n := range flags[i].Names {
			if len(n) > 1 && strings.HasPrefix(n, name) {
				matches = append(matches, match{&flags[i], n})
			}
		}
	}
	distinct := func(ms []match) []*ArgFlag {
		var fs []*ArgFlag
		for _, m := range ms {
			if !slices.Contains(fs, m.flag) {
				fs = append(fs, m.flag)
			}
		}
		return fs
	}
	pick := func(ms []match) (*ArgFlag, string, bool) {
		if fs := distinct(ms); len(fs) == 1 {
			return fs[0], fs[0].Names[0], true
		}
		return nil, "", false
	}
	if len(matches) == 0 {
		return nil, "", nil
	}
	if f, full, ok := pick(matches); ok {
		return f, full, nil
	}
	torchrun := slices.DeleteFunc(slices.Clone(matches), func(m match) bool {
		return !slices.Contains(torchrunFlags, strings.ReplaceAll(m.name, "_", "-"))
	})
	if f, full, ok := pick(torchrun); ok {
		return f, full, nil
	}
	names := make([]string, len(matches))
	for i, m := range matches {
		names[i] = "--" + m.name
	}
	return nil, "", usagef("ambiguous option: --%s could match %s (write more of the flag's name)", name, strings.Join(names, ", "))
}

// DropScriptDash returns a's arguments without the "--" that follows the
// entrypoint, which torchrun's argparse takes out (torchrun train.py --
// --depth=20 gives the script --depth=20): only that one, and only when
// no "--" ended the flags (then argparse took that one out instead, as
// gorun's flag parser does, and a second stays the script's).
func (a Argv) DropScriptDash() []string {
	if a.Dashed || a.Entry+1 >= len(a.Args) || a.Args[a.Entry+1] != "--" {
		return a.Args
	}
	return slices.Concat(a.Args[:a.Entry+1], a.Args[a.Entry+2:])
}
