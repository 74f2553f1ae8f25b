package slurmtest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/test/harness"
)

const (
	// snapSteps is the length of the snapshot example's runs here; the
	// first is cancelled once rank 0 says step snapCancelAt.
	snapSteps    = 300
	snapCancelAt = 40
)

// The PyTorch snapshot example as a rendered batch job of 2 nodes x 1
// worker with --snapshot-durable (no periodic copy due), cancelled by a
// plain scancel in the middle of training: SLURM ends it as it ends a job
// at its time limit, SIGTERM to every process of the step (the workers
// too: proctrack/linuxproc) and SIGKILL KillWait (5 s here) later. Each
// agent copies its ranks' last snapshots to the durable directory within
// that; the job submitted again (a new job id, as a user resubmits)
// restores the step the first run had reached, at most the step in flight
// redone, and its final model is bit-identical to a fault-free run's.
func TestSbatchSnapshotsCancelledAndRunAgain(t *testing.T) {
	torch.Require(t)
	dir := tempDir(t)
	ref, got, durable := filepath.Join(dir, "ref.pt"), filepath.Join(dir, "got.pt"), filepath.Join(dir, "durable")
	script := filepath.Join(moduleRoot, "examples", "pytorch", "snapshots.py")
	args := []string{"--model-mb", "2", "--steps", strconv.Itoa(snapSteps)}
	faultFree(t, script, append(args, "--out", ref))

	c := Start(t, 2)
	job := writeFile(t, dir, "snap.sbatch", render(t, script, "--nodes", "2", "--nproc-per-node", "1", "--time", "10",
		"--output", dir, "--job-name", "snap", "--env", "PYTHON="+python,
		"--", "--snapshot-durable="+durable, "--snapshot-durable-every=100000"), 0o644)

	first := c.Sbatch(t, dir, job, append(args, "--out", got)...)
	w := watch(t, filepath.Join(dir, "snap-"+first+".out"))
	w.wait(t, fmt.Sprintf("rank 0 at step %d", snapCancelAt), 2*time.Minute, func(l string) bool {
		return strings.Contains(l, fmt.Sprintf("step %d loss", snapCancelAt))
	})
	c.MustRun(t, "scancel", first)
	cancelled := time.Now()
	ended := c.WaitJob(t, first, time.Minute, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
	output := readFile(t, ended["StdOut"])
	require.Equal(t, "CANCELLED", ended["JobState"], "job output:\n%s", harness.Tail(output, 40))
	reached := harness.LastStep(output)
	require.GreaterOrEqual(t, reached, snapCancelAt, "job output:\n%s", harness.Tail(output, 40))
	require.Less(t, reached, snapSteps, "the first run finished before it was cancelled")
	copied := w.seen(func(l string) bool { return strings.Contains(l, "gorun: snapshots: this node's newest is step ") })
	require.False(t, copied.IsZero(), "no agent said where its last snapshots went (killed by SIGKILL first?):\n%s",
		harness.Tail(output, 40))
	c.WaitNoJobProcs(t, 15*time.Second)

	second := c.Sbatch(t, dir, job, append(args, "--out", got)...)
	ended = c.WaitJob(t, second, 3*time.Minute, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
	again := readFile(t, ended["StdOut"])
	require.Equal(t, "COMPLETED", ended["JobState"], "job output:\n%s", harness.Tail(again, 40))
	restored, line := durableRestore(again)
	require.NotEmpty(t, line, "the job run again did not restore from the durable directory:\n%s", harness.Tail(again, 40))
	require.GreaterOrEqual(t, int(restored), reached-1,
		"restored step %d; the cancelled run had reached %d (at most the step in flight is redone): %s", restored, reached, line)
	require.Contains(t, again, fmt.Sprintf("restored step %d\n", restored))
	requireSameModel(t, ref, got)
	t.Logf("cancelled at step %d; the agents' last copy said %s after scancel; the job run again restored step %d from the durable directory, final model bit-identical",
		reached, copied.Sub(cancelled).Round(10*time.Millisecond), restored)
	c.WaitNoJobProcs(t, 15*time.Second)
}

// faultFree trains script (the snapshot example) with args fault-free: 2
// workers of one gorun, outside the cluster, the same world size as the
// job's and so the same model bit for bit.
func faultFree(t *testing.T, script string, args []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gorun(t), append([]string{"--standalone", "--nproc-per-node=2", "--snapshots=false",
		"--", python, script}, args...)...)
	cmd.Env = append(os.Environ(), "GLOO_SOCKET_IFNAME=lo")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the fault-free run:\n%s", harness.Tail(string(out), 40))
}

// durableRestore finds the agent's agreement to restore from the durable
// directory in a job's output: its step and the line, or "".
func durableRestore(output string) (uint64, string) {
	for _, l := range strings.Split(output, "\n") {
		var a struct {
			Message string `json:"message"`
			Restore bool   `json:"restore"`
			Step    uint64 `json:"step"`
		}
		if json.Unmarshal([]byte(l), &a) == nil && a.Restore && strings.Contains(a.Message, "from the durable directory") {
			return a.Step, l
		}
	}
	return 0, ""
}

// requireSameModel fails unless the state_dicts torch.save wrote at ref
// and got hold the same tensors, bit for bit.
func requireSameModel(t *testing.T, ref, got string) {
	t.Helper()
	require.NoError(t, harness.SameModel(python, ref, got))
}
