package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// --set keeps a TOML array whole, commas and all, before or after the
// train.toml.
func TestSetKeepsCommas(t *testing.T) {
	toml, err := filepath.Abs(filepath.Join("..", "..", "examples", "train.toml"))
	require.NoError(t, err)
	for _, args := range [][]string{
		{"estimate", toml, "--set", `data.files=["a.txt", "b/*.txt"]`, "--set", "model.layers=3"},
		{"estimate", "--set", `data.files=["a.txt", "b/*.txt"]`, "--set=model.layers=3", toml},
	} {
		code, stdout, stderr := run(t, nil, args...)
		require.Equal(t, 0, code, stderr)
		require.Contains(t, stdout, "(3 layers,")
	}
}

// Flags after the positional argument count as before it, in each form;
// a wrong one is one usage line naming it.
func TestTrailingFlags(t *testing.T) {
	toml, err := filepath.Abs(filepath.Join("..", "..", "examples", "train.toml"))
	require.NoError(t, err)
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"estimate: valued flag after", []string{"estimate", toml, "--nodes", "2"}, 0, "world: 2 nodes x 1 process = 2 GPUs"},
		{"estimate: -flag=value after", []string{"estimate", toml, "-nproc-per-node=3"}, 0, "world: 1 node x 3 processes = 3 GPUs"},
		{"estimate: alias after", []string{"estimate", toml, "--nproc_per_node", "3"}, 0, "world: 1 node x 3 processes = 3 GPUs"},
		{"estimate: bool after", []string{"estimate", toml, "--json"}, 0, `"strategy"`},
		{"estimate: -set=x after", []string{"estimate", toml, "-set=model.layers=3"}, 0, "(3 layers,"},
		{"estimate: unknown flag after", []string{"estimate", toml, "--bogus"}, 2, "estimate: unknown flag --bogus (gorun estimate --help lists the flags)"},
		{"estimate: valued flag last", []string{"estimate", toml, "--nodes"}, 2, "estimate: flag --nodes needs a value"},
		{"estimate: bad value after", []string{"estimate", toml, "--nodes=x"}, 2, "estimate: --nodes=x:"},
		{"estimate: two files", []string{"estimate", toml, "--nodes", "2", toml}, 2, "estimate: one train.toml at most, got " + toml + " " + toml},
		{"metrics: --set is no flag of it", []string{"metrics", "plot", "m.jsonl", "--set", "a.b=1"}, 2, "metrics plot: unknown flag --set (gorun metrics plot --help lists the flags)"},
		{"sbatch: two entrypoints", []string{"sbatch", toml, "--nodes", "2", "x.py", "--", "--max-restarts=1"}, 2, "sbatch: one entrypoint, got"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := run(t, nil, tt.args...)
			require.Equal(t, tt.code, code, stderr)
			require.Contains(t, stdout+stderr, tt.want)
		})
	}
}
