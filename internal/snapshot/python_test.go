package snapshot

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
// the other slot is incomplete, and Scan offers only step 3. Copied by
// RankSlots under another rank's name, Python restores it there.
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

	// What an agent does for a new rank 2 of a world of 3: copy the
	// replicated snapshot under rank 2's name with RankSlots, checking the
	// CRC on the way; the Python package restores it there, with the
	// agreed step and the CRC taken as verified.
	other := t.TempDir()
	dst, err := OpenRank(other, 2)
	require.NoError(t, err)
	require.NoError(t, dst.Write(s.Header, bytes.NewReader(payload)))
	require.NoError(t, dst.Close())
	restore := `
import sys, torch, gorun
torch.manual_seed(1)
model = torch.nn.Linear(300, 200)
state = {"model": model, "step": 0}
step = gorun.Snapshots(sys.argv[1], 2, world_size=3).restore(state)
torch.manual_seed(0)
want = torch.nn.Linear(300, 200)
with torch.no_grad():
    for _ in range(3):
        want.weight.add_(1)
assert torch.equal(model.weight, want.weight) and torch.equal(model.bias, want.bias)
print(step, state["step"])
`
	cmd = exec.Command(python, "-c", restore, other)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join("..", "..", "python"),
		"GORUN_SNAPSHOT_STEP=3", "GORUN_SNAPSHOT_VERIFIED=1")
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "output: %s", out)
	require.Equal(t, "3 3\n", string(out))
}

// TestPythonAsksTheAgentForCRCs: with GORUN_SNAPSHOT_CRC naming a
// CRCServer, the Python package's saves take their CRCs from it (one per
// save) and are complete (Go verifies them); restore verifies through it
// too. Naming a socket nobody serves, the saves are still complete, their
// CRCs computed in the worker, and each Snapshots object says so once on
// stderr. Snapshots in another directory than the socket's compute their
// own CRCs without a word.
func TestPythonAsksTheAgentForCRCs(t *testing.T) {
	python := torch.Require(t)
	script := `
import sys, torch, gorun
snaps = gorun.Snapshots(sys.argv[1], 0, world_size=1)
model = torch.nn.Linear(300, 200)
for step in range(1, 4):
    with torch.no_grad():
        model.weight.add_(1)
    snaps.save(step, {"model": model})
    snaps.wait()
snaps.close()
again = gorun.Snapshots(sys.argv[1], 0, world_size=1)
print(again.restore({"model": torch.nn.Linear(300, 200)}))
`
	run := func(dir, socket string) string {
		cmd := exec.Command(python, "-c", script, dir)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join("..", "..", "python"), EnvCRC+"="+socket)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.NoError(t, err, "stderr: %s", stderr.String())
		require.Equal(t, "3\n", string(out))
		paths := Paths(dir, 0)
		s, err := Newest(paths[:]...)
		require.NoError(t, err)
		require.Equal(t, uint64(3), s.Step)
		return stderr.String()
	}

	dir := t.TempDir()
	srv, err := ServeCRC(dir)
	require.NoError(t, err)
	defer srv.Close()
	require.Empty(t, run(dir, srv.Path()))
	require.Equal(t, uint64(3+1), srv.Served(), "one CRC per save, and the restore's")
	// Snapshots in a directory of the script's own: the agent's socket,
	// which serves its directory's slots only, is not asked.
	require.Empty(t, run(t.TempDir(), srv.Path()))
	require.Equal(t, uint64(3+1), srv.Served())

	dir = t.TempDir()
	stderr := run(dir, filepath.Join(dir, "nobody.sock"))
	require.Equal(t, 2, strings.Count(stderr, "computing the CRCs here from now on"), "once per Snapshots object:\n%s", stderr)
}
