package snapshot

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/testutil"
)

var torch testutil.Torch

// TestReadsWhatPythonWrites has the real Python package, as rank 1 of 2 of
// a data-parallel job, save steps 1..3 and die of SIGKILL in the middle of
// step 4's save (its payload and CRC written, not its header): Go finds
// step 3 the newest complete snapshot, with the rank, world and REPLICATED
// flag Python wrote and a payload whose zlib CRC-32 hash/crc32 verifies;
// the other slot is incomplete, and Scan offers only step 3.
func TestReadsWhatPythonWrites(t *testing.T) {
	python := torch.Require(t)
	dir := t.TempDir()
	script := `
import os, signal, sys, torch, gorun
def hook(step):
    if step == 4:
        os.kill(os.getpid(), signal.SIGKILL)
snaps = gorun.Snapshots(sys.argv[1], 1, world_size=2, replicated=True, _before_header=hook)
torch.manual_seed(0)
model = torch.nn.Linear(300, 200)
for step in range(1, 5):
    with torch.no_grad():
        model.weight.add_(1)
    snaps.save(step, {"model": model, "step": step})
    snaps.wait()
`
	cmd := exec.Command(python, "-c", script, dir)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join("..", "..", "python"))
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "output: %s", out)
	require.Equal(t, "signal: killed", exit.Error(), "output: %s", out)

	paths := Paths(dir, 1)
	s, err := Newest(paths[:]...)
	require.NoError(t, err)
	require.Equal(t, uint64(3), s.Step)
	require.Equal(t, 1, s.Rank)
	require.Equal(t, 2, s.World)
	require.True(t, s.Replicated())
	payload, err := ReadPayload(s)
	require.NoError(t, err)
	require.Greater(t, len(payload), 200*300*4, "the payload holds the weights")
	// The other slot holds step 4's payload, but no header.
	var incomplete int
	for _, p := range paths {
		if _, err := Verify(p); err != nil {
			require.ErrorIs(t, err, ErrIncomplete)
			incomplete++
		}
	}
	require.Equal(t, 1, incomplete)

	held, err := Scan(dir)
	require.NoError(t, err)
	require.Equal(t, []Holding{{Rank: 1, World: 2, Step: 3, Replicated: true, Path: s.Path}}, held)
}
