package slurmtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/test/harness"
	"github.com/gorun/gorun/trainer/metrics"
)

// trainerSets is a tiny model of the embedded trainer: about 20 ms a step
// on the lab, a global batch of 24 that divides over 6 and 4 workers, a checkpoint every
// 5 steps and a metrics record every step.
func trainerSets(steps int, ckptDir, metrics string) []string {
	return []string{
		"--set", "model.layers=1", "--set", "model.d_model=16", "--set", "model.heads=2", "--set", "model.context=16",
		"--set", "train.global_batch=24", "--set", "train.micro_batch=2", "--set", fmt.Sprintf("train.steps=%d", steps),
		"--set", "train.log_every=1", "--set", "optim.warmup=5",
		"--set", "checkpoint.every=5", "--set", fmt.Sprintf("checkpoint.dir=%q", ckptDir),
		"--metrics", metrics,
	}
}

// trainerToml writes a small text corpus and a train.toml reading it into
// dir (on the filesystem the nodes share) and returns the toml's path.
func trainerToml(t *testing.T, dir string) string {
	t.Helper()
	var corpus strings.Builder
	for i := range 200 {
		fmt.Fprintf(&corpus, "line %d: the quick brown fox jumps over the lazy dog; func f%d() int { return %d }\n", i, i, i*i)
	}
	writeFile(t, dir, "corpus.txt", corpus.String(), 0o644)
	return writeFile(t, dir, "train.toml", "[data]\nfiles = [\"corpus.txt\"]\n\n[train]\nmetrics = \"\"\n", 0o644)
}

// metricsRecord is one line of the trainer's metrics file (the tests name their metrics paths
// "metrics", which hides the package).
type metricsRecord = metrics.Record

// readMetrics returns the job's final line of steps in the metrics file (harness.Records): none
// while it does not exist yet, or is empty.
func readMetrics(t *testing.T, path string) []metricsRecord {
	t.Helper()
	recs, err := harness.Records(path)
	require.NoError(t, err)
	return recs
}

// waitMetrics polls the metrics file every 20 ms until a record matches
// and returns that record and when it was seen.
func waitMetrics(t *testing.T, path, what string, within time.Duration, match func(metricsRecord) bool) (metricsRecord, time.Time) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, r := range readMetrics(t, path) {
			if match(r) {
				return r, time.Now()
			}
		}
		if time.Now().After(deadline) {
			recs := readMetrics(t, path)
			t.Fatalf("waiting %s for %s in %s; %d records, last %+v", within, what, path, len(recs), recs[max(0, len(recs)-3):])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// localReference runs the trainer fault-free outside SLURM with nproc
// workers and returns its checkpoint directory.
func localReference(t *testing.T, toml, dir string, nproc, steps int) string {
	t.Helper()
	ckpt := filepath.Join(dir, "ckpt")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	args := append([]string{fmt.Sprintf("--nproc-per-node=%d", nproc), toml}, trainerSets(steps, ckpt, filepath.Join(dir, "metrics.jsonl"))...)
	cmd := exec.CommandContext(ctx, gorun(t), args...)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLURM_") && !strings.HasPrefix(kv, "GORUN_") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "reference run:\n%s", harness.Tail(string(out), 30))
	return ckpt
}

// normDiff is harness.NormDiff of the newest checkpoints of ref and got: ||got-ref|| / ||ref||
// per group of tensors (params, optim.m, optim.v). Across world sizes only such a norm is
// meaningful: some values are float noise around zero.
func normDiff(t *testing.T, ref, got string) map[string]float64 {
	t.Helper()
	rel, err := harness.NormDiff(context.Background(), ref, got)
	require.NoError(t, err)
	return rel
}

// newestStep is the step of the newest complete checkpoint in dir (harness.NewestStep).
func newestStep(t *testing.T, dir string) int64 {
	t.Helper()
	step, err := harness.NewestStep(dir)
	require.NoError(t, err)
	return step
}

// crashNow SIGKILLs every process on node (slurmd, slurmstepd, the job's
// processes) as Crash does, from one scan of /proc in this process rather
// than a script's (which takes seconds on a busy machine, while a step
// takes tens of ms), then once more for anything forked meanwhile; it
// returns when the first kill was sent.
func crashNow(c *Cluster, node string) time.Time {
	var at time.Time
	for pass := 0; pass < 2; pass++ {
		for _, p := range c.NodeProcs()[node] {
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
		}
		if pass == 0 {
			at = time.Now()
		}
	}
	return at
}

var resumingAt = regexp.MustCompile(`resuming at step (\d+)`)

// The embedded trainer from the rendered script on 3 nodes of 2 workers
// with --min-nodes 2: node3 crashes at about step 15; the job goes on
// with 2 nodes (world size 4) from the newest checkpoint and completes,
// and its final checkpoint matches a fault-free run at world size 4
// within 1e-5 relative (L2 norm per tensor group).
func TestSbatchTrainerNodeCrash(t *testing.T) {
	const steps = 60
	dir := tempDir(t)
	toml := trainerToml(t, dir)
	ref := localReference(t, toml, filepath.Join(dir, "ref"), 4, steps)

	c := Start(t, 3)
	script := writeFile(t, dir, "train.sbatch", render(t, toml, "--nodes", "3", "--min-nodes", "2", "--nproc-per-node", "2",
		"--time", "10", "--output", dir, "--job-name", "train"), 0o644)
	ckpt, metrics := filepath.Join(dir, "ckpt"), filepath.Join(dir, "metrics.jsonl")
	id := c.Sbatch(t, dir, script, trainerSets(steps, ckpt, metrics)...)
	w := watch(t, filepath.Join(dir, "train-"+id+".out"))

	before, _ := waitMetrics(t, metrics, "step 15 at world size 6", 2*time.Minute, func(r metricsRecord) bool {
		return r.Step >= 15 && r.WorldSize == 6
	})
	crashed := crashNow(c, "node3")
	atCrash := readMetrics(t, metrics)
	require.NotEmpty(t, atCrash)
	require.Less(t, atCrash[len(atCrash)-1].Step, steps-10, "the run outpaced the crash")
	running := w.wait(t, "next round runs at world size 4", 60*time.Second, func(l string) bool {
		return strings.Contains(l, `"to":"running"`) && strings.Contains(l, `"world_size":4`)
	})
	resumedLine := w.line(func(l string) bool { return resumingAt.MatchString(l) })
	first, firstAt := waitMetrics(t, metrics, "a step at world size 4", 60*time.Second, func(r metricsRecord) bool { return r.WorldSize == 4 })
	job := c.WaitJob(t, id, 2*time.Minute, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
	output := readFile(t, job["StdOut"])
	require.Equal(t, "COMPLETED", job["JobState"], "job output:\n%s", harness.Tail(output, 40))
	require.Equal(t, "0:0", job["ExitCode"])

	recs := readMetrics(t, metrics)
	last6 := 0 // the records of the steps redone at world size 4 are gone from recs, not from atCrash
	for _, r := range append(atCrash, recs...) {
		if r.WorldSize == 6 {
			last6 = max(last6, r.Step)
		}
	}
	require.Equal(t, metricsRecord{Step: steps, WorldSize: 4}, metricsRecord{Step: recs[len(recs)-1].Step, WorldSize: recs[len(recs)-1].WorldSize},
		"the last metrics record is step %d at world size 4", steps)
	// Every step after the resume is recorded once at world size 4, in order.
	from := first.Step - 1
	var at4 []int
	for _, r := range recs {
		if r.WorldSize == 4 {
			at4 = append(at4, r.Step)
		}
	}
	require.Len(t, at4, steps-from, "steps %d..%d at world size 4", from+1, steps)
	for i, s := range at4 {
		require.Equal(t, from+1+i, s)
	}
	require.Equal(t, int64(steps), newestStep(t, ckpt))
	if m := resumingAt.FindStringSubmatch(resumedLine); m != nil {
		require.Equal(t, strconv.Itoa(from), m[1], "the resume line names the step the metrics go on after: %s", resumedLine)
	}

	rel := normDiff(t, ref, ckpt)
	for g, v := range rel {
		require.LessOrEqual(t, v, 1e-5, "%s differs from the world-size-4 reference by %.2e relative (L2)", g, v)
	}
	ms := func(at time.Time) string { return at.Sub(crashed).Round(10 * time.Millisecond).String() }
	t.Logf("node3 crashed at step %d..%d (last step at world size 6: %d): next round (world 4) running %s, first new step (%d) %s; resumed from step %d, %d step(s) lost; "+
		"||a-b||/||a|| vs the local world-4 reference: params %.2e, optim.m %.2e, optim.v %.2e",
		before.Step, atCrash[len(atCrash)-1].Step, last6, ms(running), first.Step, ms(firstAt), from, last6-from, rel["params"], rel["optim.m"], rel["optim.v"])
	c.WaitNoJobProcs(t, 15*time.Second)
	c.Revive(t, "node3")
}

// The embedded trainer from the rendered script on 2 nodes of 2 workers:
// scancel --signal=USR1 mid-run makes every worker checkpoint at the next
// step and exit 75, and gorun exit 75 on both nodes; scontrol requeue
// then runs the job again (SLURM_RESTART_COUNT=1), which resumes from
// that checkpoint: the metrics hold every step once, and the job completes.
func TestSbatchTrainerRequeue(t *testing.T) {
	const steps = 300
	dir := tempDir(t)
	toml := trainerToml(t, dir)
	c := Start(t, 2)
	script := writeFile(t, dir, "train.sbatch", render(t, toml, "--nodes", "2", "--nproc-per-node", "2",
		"--time", "10", "--output", dir, "--job-name", "train"), 0o644)
	require.Contains(t, readFile(t, script), "#SBATCH --requeue")
	ckpt, metrics := filepath.Join(dir, "ckpt"), filepath.Join(dir, "metrics.jsonl")
	id := c.Sbatch(t, dir, script, trainerSets(steps, ckpt, metrics)...)

	waitMetrics(t, metrics, "step 10", 2*time.Minute, func(r metricsRecord) bool { return r.Step >= 10 })
	c.MustRun(t, "scancel", "--signal=USR1", id)
	// Seconds when the machine is quiet; minutes were seen with other test
	// packages running beside this one on 2 cores.
	job := c.WaitJob(t, id, 3*time.Minute, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
	first := readFile(t, job["StdOut"])
	t.Logf("after USR1: JobState %s ExitCode %s Restarts %s Reason %s", job["JobState"], job["ExitCode"], job["Restarts"], job["Reason"])
	require.Equal(t, "75:0", job["ExitCode"], "job output:\n%s", harness.Tail(first, 40))
	for _, task := range []string{"node1: task 0", "node2: task 1"} {
		require.Contains(t, first, task+": Exited with exit code 75")
	}
	require.Contains(t, first, "requeue the job to resume")
	at := int(newestStep(t, ckpt))
	recs := readMetrics(t, metrics)
	require.Equal(t, at, recs[len(recs)-1].Step, "the workers checkpointed the last step they took")
	require.Less(t, at, steps)

	c.WaitNoJobProcs(t, 15*time.Second)
	// slurmd revokes a job's credential when it ends and refuses a launch
	// whose credential was made in the same second ("Job credential
	// revoked"): requeue only once the clock is past the end's second.
	ended, err := time.ParseInLocation("2006-01-02T15:04:05", job["EndTime"], time.Local)
	require.NoError(t, err, "EndTime %q", job["EndTime"])
	time.Sleep(time.Until(ended.Add(2 * time.Second)))
	out, code := c.Run(t, commandTimeout, "scontrol", "requeue", id)
	t.Logf("scontrol requeue %s: exit %d %s", id, code, strings.TrimSpace(out))
	require.Equal(t, 0, code)
	requeued := time.Now()
	// SLURM 22.05 holds a requeued job back (it ran again 2m27s after the
	// requeue without this); make it eligible now.
	c.MustRun(t, "scontrol", "update", "JobId="+id, "StartTime=now")
	// Right after the requeue scontrol may still show the first run's end
	// (FAILED): wait for the second run's own first step before its end.
	waitMetrics(t, metrics, "a step after the requeue", 3*time.Minute, func(r metricsRecord) bool { return r.Step > at })
	job = c.WaitJob(t, id, 3*time.Minute, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
	t.Logf("requeued to ended %s: JobState %s ExitCode %s Restarts %s", time.Since(requeued).Round(100*time.Millisecond), job["JobState"], job["ExitCode"], job["Restarts"])
	output := readFile(t, job["StdOut"])
	require.Equal(t, "COMPLETED", job["JobState"], "job output:\n%s", harness.Tail(output, 40))
	require.Equal(t, "1", job["Restarts"])
	require.Contains(t, output, fmt.Sprintf("resuming at step %d", at))
	recs = readMetrics(t, metrics)
	require.Len(t, recs, steps, "steps 1..%d once each", steps)
	for i, r := range recs {
		require.Equal(t, i+1, r.Step, "record %d", i)
	}
	t.Logf("USR1 at step >= 10: checkpointed step %d, exit 75 on both nodes; requeued run resumed at step %d, steps 1..%d each once", at, at, steps)
	c.WaitNoJobProcs(t, 15*time.Second)
}
