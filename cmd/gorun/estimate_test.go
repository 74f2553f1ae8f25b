package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEstimateActivationCheckpointing: the activations follow
// train.activation_checkpointing, and a line says what it trades.
func TestEstimateActivationCheckpointing(t *testing.T) {
	toml, err := filepath.Abs(filepath.Join("..", "..", "examples", "train.toml"))
	require.NoError(t, err)
	issue22 := []string{"--set", "model.layers=8", "--set", "model.d_model=512", "--set", "model.heads=8", "--set", "train.micro_batch=2"}

	code, stdout, stderr := run(t, nil, append([]string{"estimate", toml}, issue22...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "activation checkpointing off: activations 47.5 MB; with train.activation_checkpointing = true 10.8 MB, for +19.5 % FLOPs")

	code, stdout, stderr = run(t, nil, append([]string{"estimate", toml, "--set", "train.activation_checkpointing=true"}, issue22...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "activation checkpointing on: activations 10.8 MB (47.5 MB without) for +19.5 % FLOPs")
	require.Regexp(t, `hsdp \*.* 10\.8 MB `, stdout, "the row of the trainer counts the activations with checkpointing")
}
