package workercmd

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/worker"
)

// Run's command line, up to the worker: every mistake is a usage error
// (exit 2) that names the command, and flags count after the train.toml
// as before it.
func TestRunCommandLine(t *testing.T) {
	toml := filepath.Join(t.TempDir(), "train.toml")
	require.NoError(t, os.WriteFile(toml, []byte("[train]\nsteps = 1\n\n[optim]\nwarmup = 1\n"), 0o644))
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"no train.toml", nil, "gorun-worker: give one train.toml: gorun-worker train.toml [--set"},
		{"two", []string{toml, toml}, "gorun-worker: give one train.toml"},
		{"unknown flag", []string{toml, "--bogus"}, "gorun-worker: unknown flag --bogus (gorun-worker --help lists the flags)"},
		{"unknown flag, one dash", []string{"-bogus", toml}, "gorun-worker: unknown flag --bogus"},
		{"flag without its value", []string{toml, "--threads"}, "gorun-worker: flag needs an argument: -threads"},
		{"missing file", []string{"nope.toml"}, "nope.toml"},
		{"--set after the train.toml", []string{toml, "--set", "train.steps=x"}, "--set train.steps=x"},
		{"--set=", []string{"--set=train.steps=-1", toml}, "--set train.steps=-1: must be at least 1"},
		{"-set= after the train.toml", []string{toml, "-set=train.steps=-1"}, "--set train.steps=-1: must be at least 1"},
		{"--set without its value", []string{toml, "--set"}, "gorun-worker: flag --set needs a value"},
		{"a second train.toml after a flag", []string{toml, "--threads", "2", toml}, "gorun-worker: give one train.toml"},
		{"negative threads after the train.toml", []string{toml, "--threads=-1"}, "gorun-worker: --threads=-1: must be at least 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := Run(context.Background(), "gorun-worker", tt.args, &stdout, &stderr)
			var exit *worker.ExitError
			require.True(t, errors.As(err, &exit), "want an *Error, got %v", err)
			require.Equal(t, worker.ExitUsage, exit.Code)
			require.ErrorContains(t, err, tt.wantErr)
			require.Empty(t, stdout.String())
		})
	}
}

// --help prints the synopsis, the description and the flags, not the
// hidden ones, and is no error.
func TestRunHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"train.toml", "--help"}} {
		var stdout bytes.Buffer
		require.NoError(t, Run(context.Background(), "gorun worker", args, &stdout, &bytes.Buffer{}))
		help := stdout.String()
		require.Contains(t, help, "usage: gorun worker train.toml [--set")
		require.Contains(t, help, "Reads the torchrun environment contract")
		for _, flag := range []string{"--set VALUE", "--metrics VALUE", "--threads VALUE", "--profile\n"} {
			require.Contains(t, help, flag)
		}
		require.NotContains(t, help, "dump-params")
	}
}
