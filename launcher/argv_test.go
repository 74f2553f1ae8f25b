package launcher

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// argvFlags are some of gorun's launch flags: torchrun's under both
// spellings, and gorun's own.
func argvFlags() []ArgFlag {
	return []ArgFlag{
		{Names: []string{"nproc-per-node", "nproc_per_node"}, Value: true},
		{Names: []string{"nnodes"}, Value: true},
		{Names: []string{"node-rank", "node_rank"}, Value: true},
		{Names: []string{"no-python", "no_python"}},
		{Names: []string{"module", "m"}},
		{Names: []string{"redirects", "r"}, Value: true},
		{Names: []string{"tee", "t"}, Value: true},
		{Names: []string{"rdzv-backend", "rdzv_backend"}, Value: true},
		{Names: []string{"rdzv-endpoint", "rdzv_endpoint"}, Value: true},
		{Names: []string{"standalone"}},
		{Names: []string{"term-timeout", "term_timeout", "shutdown-timeout", "shutdown_timeout"}, Value: true},
		{Names: []string{"node-name", "node_name"}, Value: true},                 // gorun's own
		{Names: []string{"evict-stragglers", "evict_stragglers"}, Value: true},   // gorun's own
		{Names: []string{"event-log-handler", "event_log_handler"}, Value: true}, // torchrun's
	}
}

// ExpandArgv writes argparse's abbreviations out and finds the entrypoint
// as torchrun's argparse does; DropScriptDash drops the one "--" argparse
// drops.
func TestExpandArgv(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		want  []string // after DropScriptDash
		entry int
		err   string
	}{
		{"full names stay", []string{"--nproc-per-node=2", "--nnodes", "1", "train.py"}, []string{"--nproc-per-node=2", "--nnodes", "1", "train.py"}, 3, ""},
		{"--redirect=3 is --redirects", []string{"--redirect=3", "x"}, []string{"--redirects=3", "x"}, 1, ""},
		{"--nproc names one flag under both spellings", []string{"--nproc", "2", "x"}, []string{"--nproc-per-node", "2", "x"}, 2, ""},
		{"--nproc_ and --nproc-", []string{"--nproc_=2", "--nproc-=3", "x"}, []string{"--nproc-per-node=2", "--nproc-per-node=3", "x"}, 2, ""},
		{"a value that looks like a flag is a value", []string{"--rdzv-e", "--x", "x"}, []string{"--rdzv-endpoint", "--x", "x"}, 2, ""},
		{"a bool takes no value", []string{"--no-p", "prog", "a"}, []string{"--no-python", "prog", "a"}, 1, ""},
		{"short flags stay", []string{"-m", "-r", "3", "pkg.mod"}, []string{"-m", "-r", "3", "pkg.mod"}, 3, ""},
		{"torchrun's flag wins an abbreviation over gorun's own", []string{"--node=1", "x"}, []string{"--node-rank=1", "x"}, 1, ""},
		{"and over gorun's own again", []string{"--ev=console", "x"}, []string{"--event-log-handler=console", "x"}, 1, ""},
		{"--shut is --shutdown-timeout, the same flag as --term-timeout", []string{"--shut=5", "x"}, []string{"--term-timeout=5", "x"}, 1, ""},
		{"unknown flags are left to the flag parser", []string{"--bogus=1", "x"}, []string{"--bogus=1", "x"}, 1, ""},
		{"flags after the entrypoint are the entrypoint's", []string{"x", "--nproc=8", "--redirect"}, []string{"x", "--nproc=8", "--redirect"}, 0, ""},
		{"the -- after the script goes", []string{"-m", "scripts.base_train", "--", "--depth=20"}, []string{"-m", "scripts.base_train", "--depth=20"}, 1, ""},
		{"only that one", []string{"x", "--", "--", "y"}, []string{"x", "--", "y"}, 0, ""},
		{"a later -- stays", []string{"x", "a", "--", "y"}, []string{"x", "a", "--", "y"}, 0, ""},
		{"gorun [flags] -- program: the -- before the program is the flag parser's", []string{"--nproc=2", "--", "prog", "a"}, []string{"--nproc-per-node=2", "--", "prog", "a"}, 2, ""},
		{"and a -- after the program then stays", []string{"--", "prog", "--", "y"}, []string{"--", "prog", "--", "y"}, 1, ""},
		{"no entrypoint", []string{"--nproc=2"}, []string{"--nproc-per-node=2"}, 1, ""},
		{"ambiguous between flags", []string{"--n=2", "x"}, nil, 0, "ambiguous option: --n could match --nproc-per-node, --nproc_per_node, --nnodes, --node-rank, --node_rank, --no-python, --no_python, --node-name, --node_name"},
		{"ambiguous among torchrun's", []string{"--rdzv=x", "x"}, nil, 0, "--rdzv could match --rdzv-backend, --rdzv_backend, --rdzv-endpoint, --rdzv_endpoint"},
		{"--e is torchrun's --event-log-handler, not gorun's --evict-stragglers", []string{"--e=null", "x"}, []string{"--event-log-handler=null", "x"}, 1, ""},
		{"--te is torchrun's --tee, not gorun's --term-timeout", []string{"--te", "3", "x"}, []string{"--tee", "3", "x"}, 2, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := ExpandArgv(tc.args, argvFlags())
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				var usage *UsageError
				require.ErrorAs(t, err, &usage)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.entry, a.Entry)
			require.Equal(t, tc.want, a.DropScriptDash())
		})
	}
}
