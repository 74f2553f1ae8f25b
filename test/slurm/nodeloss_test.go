package slurmtest

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/proc/procfs"
	"github.com/gorun/gorun/test/harness"
)

// killTree SIGKILLs the agent on node whose command line starts with
// agentPrefix and every process under it (its workers, their children,
// its guard), from scans of /proc in this process, twice for anything
// forked meanwhile; it returns the pids it killed, the agent first. It
// fails t when node runs no such agent.
func killTree(t *testing.T, c *Cluster, node, agentPrefix string) []int {
	t.Helper()
	agent := 0
	for _, p := range c.NodeProcs()[node] {
		if strings.HasPrefix(p.Cmdline, agentPrefix) {
			require.Zero(t, agent, "two agents on %s: %d and %d", node, agent, p.PID)
			agent = p.PID
		}
	}
	require.NotZero(t, agent, "no process %q on %s: %v", agentPrefix, node, c.NodeProcs()[node])
	killed := []int{agent}
	seen := map[int]bool{agent: true}
	for range 2 {
		children := map[int][]int{}
		for _, p := range processes() {
			if pp := parentOf(p.PID); pp > 0 {
				children[pp] = append(children[pp], p.PID)
			}
		}
		tree := []int{agent}
		for i := 0; i < len(tree); i++ {
			tree = append(tree, children[tree[i]]...)
		}
		for _, pid := range tree {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			if !seen[pid] {
				seen[pid] = true
				killed = append(killed, pid)
			}
		}
	}
	return killed
}

// parentOf is pid's parent from /proc/PID/stat, 0 when pid is gone.
func parentOf(pid int) int {
	p, err := procfs.Stat(pid)
	if err != nil {
		return 0
	}
	return p.PPID
}

// The rendered script of the embedded trainer on 4 nodes of 2 workers,
// no --min-nodes (so no --nnodes: gorun's SLURM default), memory copies
// on and no periodic checkpoint. Once step 10 is in the metrics at world
// size 8, node1's gorun — an embedded etcd member, the first aggregator,
// the node of worker rank 0 — and its whole process tree are killed -9.
// The three nodes left go on in place at world size 6 (global batch 24
// divides over 8 and 6 ranks of micro batch 1) from what they hold (no
// checkpoint exists to read): every step once after the loss, at most
// the step in flight redone, the last step reached at world size 6, and
// its final checkpoint complete; the round that went on names node1, and
// the three agents left end succeeded (the step's exit is node1's 137).
func TestSbatchTrainerFirstNodeLost(t *testing.T) {
	const steps = 300
	dir := tempDir(t)
	toml := trainerToml(t, dir)
	c := Start(t, 4)
	script := writeFile(t, dir, "train.sbatch", render(t, toml, "--nodes", "4", "--nproc-per-node", "2",
		"--time", "10", "--output", dir, "--job-name", "train"), 0o644)
	require.NotContains(t, readFile(t, script), "--nnodes", "the SLURM default, not a range")
	ckpt, metrics := filepath.Join(dir, "ckpt"), filepath.Join(dir, "metrics.jsonl")
	sets := append(trainerSets(steps, ckpt, metrics),
		"--set", "train.micro_batch=1", "--set", "checkpoint.every=0", "--set", "checkpoint.memory=true")
	id := c.Sbatch(t, dir, script, sets...)
	w := watch(t, filepath.Join(dir, "train-"+id+".out"))

	waitMetrics(t, metrics, "step 10 at world size 8", 2*time.Minute, func(r metricsRecord) bool {
		return r.Step >= 10 && r.WorldSize == 8
	})
	killed := killTree(t, c, "node1", gorun(t)+" --nproc-per-node")
	atKill := readMetrics(t, metrics)
	require.Less(t, atKill[len(atKill)-1].Step, steps-20, "the run outpaced the kill")
	require.GreaterOrEqual(t, len(killed), 3, "gorun and its 2 workers: %v", killed)

	w.wait(t, "a round at world size 6 runs", 2*time.Minute, func(l string) bool {
		return strings.Contains(l, `"to":"running"`) && strings.Contains(l, `"world_size":6`)
	})
	job := c.WaitJob(t, id, 3*time.Minute, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
	output := readFile(t, job["StdOut"])
	t.Logf("job %s: JobState %s ExitCode %s", id, job["JobState"], job["ExitCode"])

	recs := readMetrics(t, metrics)
	last := recs[len(recs)-1]
	require.Equal(t, metricsRecord{Step: steps, WorldSize: 6}, metricsRecord{Step: last.Step, WorldSize: last.WorldSize},
		"the last record is step %d at world size 6; job output:\n%s", steps, harness.Tail(output, 40))
	last8, first6 := 0, 0
	for _, r := range recs {
		switch {
		case r.WorldSize == 8:
			last8 = r.Step
		case r.WorldSize == 6 && first6 == 0:
			first6 = r.Step
		}
		require.Contains(t, []int{6, 8}, r.WorldSize, "step %d", r.Step)
	}
	for i, r := range recs {
		require.Equal(t, i+1, r.Step, "every step once in the job's final line of steps")
	}
	require.Equal(t, last8+1, first6, "world size 6 goes on after the last step at world size 8")
	raw := rawSteps(t, metrics)
	redone := raw - steps
	require.LessOrEqual(t, redone, 1, "at most the step in flight is redone (%d records for %d steps)", raw, steps)
	require.Equal(t, int64(steps), newestStep(t, ckpt), "the final checkpoint is complete")
	for _, l := range strings.Split(output, "\n") {
		require.NotContains(t, l, "resuming at step", "no checkpoint to resume from: the survivors went on in place")
	}
	// node1's task died of SIGKILL, which srun reports as the step's exit
	// (137); the three other agents saw the job succeed.
	require.Equal(t, "137:0", job["ExitCode"], "job output:\n%s", harness.Tail(output, 40))
	succeeded := 0
	for _, l := range strings.Split(output, "\n") {
		if strings.Contains(l, `"message":"agent state"`) && strings.Contains(l, `"to":"succeeded"`) {
			succeeded++
		}
	}
	require.Equal(t, 3, succeeded, "the agents of node2..node4 end succeeded; job output:\n%s", harness.Tail(output, 40))
	named := w.line(func(l string) bool {
		return strings.Contains(l, `"round state"`) && strings.Contains(l, `"to":"joinable"`) && strings.Contains(l, "node1")
	})
	require.NotEmpty(t, named, "the round after the loss names node1; job output:\n%s", harness.Tail(output, 40))
	t.Logf("killed node1's gorun tree %v at step %d; last step at world size 8: %d, first at 6: %d, %d redone; %s",
		killed, atKill[len(atKill)-1].Step, last8, first6, redone, named)
	c.WaitNoJobProcs(t, 15*time.Second)
}

// rawSteps counts every record in the metrics file, those a later world
// superseded included.
func rawSteps(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return bytes.Count(data, []byte("\n"))
}
