package slurmtest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/rendezvous/etcdembed"
	"github.com/gorun/gorun/test/harness"
)

// repeatedStarts is how many 3-node jobs TestSbatchStartsRepeatedly runs.
const repeatedStarts = 6

// The script `gorun sbatch` renders for 3 nodes (a 3-member embedded etcd
// with a fresh job secret per run) starts and completes every time,
// submitted again and again, and leaves no etcd data dir behind, not even
// the one a SIGKILLed member left before (planted here, as a gorun killed
// by srun leaves it). It failed to start 1 time in 3 to 8 when members
// reused such dirs and raced to set up authentication.
func TestSbatchStartsRepeatedly(t *testing.T) {
	dir := tempDir(t)
	toml := trainerToml(t, dir)
	c := Start(t, 3)
	require.NoError(t, os.MkdirAll(c.tmpDir(), 0o755))
	stale := filepath.Join(c.tmpDir(), etcdembed.DataDirPrefix+"1-node2-left")
	require.NoError(t, os.MkdirAll(filepath.Join(stale, "etcd", "member", "wal"), 0o700))
	writeFile(t, stale, "lock", "", 0o600) // nobody holds it: its gorun is gone

	script := writeFile(t, dir, "train.sbatch", render(t, toml, "--nodes", "3", "--nproc-per-node", "2",
		"--time", "10", "--output", dir, "--job-name", "start"), 0o644)
	require.Contains(t, readFile(t, script), "job-secret")
	var ids []string
	for i := range repeatedStarts {
		run := filepath.Join(dir, fmt.Sprintf("run%d", i))
		ids = append(ids, c.Sbatch(t, dir, script, trainerSets(10, filepath.Join(run, "ckpt"), filepath.Join(run, "metrics.jsonl"))...))
	}
	for i, id := range ids {
		job := c.WaitJob(t, id, 3*time.Minute, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
		out := readFile(t, job["StdOut"])
		require.Equal(t, "COMPLETED", job["JobState"], "start %d (job %s) output:\n%s", i, id, harness.Tail(out, 40))
		require.Equal(t, "0:0", job["ExitCode"])
		recs := readMetrics(t, filepath.Join(dir, fmt.Sprintf("run%d", i), "metrics.jsonl"))
		require.NotEmpty(t, recs)
		require.Equal(t, 10, recs[len(recs)-1].Step, "start %d trained to the end", i)
		require.Equal(t, 6, recs[len(recs)-1].WorldSize)
		for _, noise := range []string{"already exists", "ignored grant role", "does not have the job secret", "publish"} {
			require.NotContains(t, out, noise, "start %d (job %s)", i, id)
		}
	}
	c.WaitNoJobProcs(t, 15*time.Second)
	left, err := filepath.Glob(filepath.Join(c.tmpDir(), etcdembed.DataDirPrefix+"*"))
	require.NoError(t, err)
	require.Empty(t, left, "every member removes its data dir, and the dead member's was swept")
	t.Logf("%d 3-node jobs with a job secret started and completed, one after another", repeatedStarts)
}
