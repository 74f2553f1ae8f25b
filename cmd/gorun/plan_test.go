package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// `gorun plan` resolves a train.toml as the run does: with $GOROOT unset,
// examples/train.toml's data files still expand.
func TestPlanTrainTomlWithoutGOROOT(t *testing.T) {
	t.Setenv("GOROOT", "")
	require.NoError(t, os.Unsetenv("GOROOT"))
	toml, err := filepath.Abs(filepath.Join("..", "..", "examples", "train.toml"))
	require.NoError(t, err)
	code, stdout, stderr := run(t, nil, "plan", "--nproc-per-node=2", toml)
	require.Equal(t, 0, code, stderr)
	var plan struct {
		RunID   string   `json:"run_id"`
		Command []string `json:"command"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &plan))
	require.Regexp(t, `^gorun-[0-9a-f]{12}$`, plan.RunID, "one node: a fresh run id")
	require.Equal(t, []string{"worker", toml}, plan.Command[1:])
}

// --standalone with --master-port uses that port.
func TestPlanStandaloneMasterPort(t *testing.T) {
	code, stdout, stderr := run(t, nil, "plan", "--standalone", "--master-port=29555", "--", "true")
	require.Equal(t, 0, code, stderr)
	var plan struct {
		MasterPort int `json:"master_port"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &plan))
	require.Equal(t, 29555, plan.MasterPort)
}
