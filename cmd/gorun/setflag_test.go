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
