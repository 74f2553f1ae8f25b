package e2e

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/test/harness"
	"github.com/gorun/gorun/trainer/metrics"
)

// faultSets: the resume model (a few ms a step at world size 6), 40 steps, a checkpoint every 5
// and a metrics record every step; a global batch of 24 divides into micro batches of 2 on 4 and
// on 6 ranks, the two world sizes a three-node job of 2 workers a node passes through.
var faultSets = append(append([]string(nil), trainerSets...),
	"--set", "model.layers=2", "--set", "model.d_model=32", "--set", "model.context=32",
	"--set", "train.global_batch=24", "--set", "train.steps=40", "--set", "train.log_every=1",
	"--set", "checkpoint.every=5")

// faultJob is one elastic job of the embedded trainer under test: its agents, their checkpoint
// directory and their metrics files, one a rank.
type faultJob struct {
	t        *testing.T
	toml     string
	endpoint string // "" under the faked SLURM step (embedded etcd)
	runID    string
	dir      string
	// pattern is the metrics path of every rank ({rank}: each rank of each round writes its own
	// file, which says which step it completed last); metrics is rank 0's, the job's record.
	pattern string
	metrics string
	nnodes  string
	agents  []*gorunProc
	// sets are --set overrides after faultSets; steps is the run's
	// train.steps when they change it (0: faultSets' 40); lastCall is the
	// rendezvous's last_call_timeout in seconds (0: 10); leaseTTL its
	// lease_ttl in seconds (0: 2).
	sets     []string
	steps    int
	lastCall int
	leaseTTL int
	// env is added to each agent's environment (its workers inherit it).
	env []string
}

func newFaultJob(t *testing.T, toml, endpoint, runID, root, nnodes string) *faultJob {
	dir := filepath.Join(root, runID)
	pattern := dir + ".rank" + metrics.RankPlaceholder + ".jsonl"
	return &faultJob{t: t, toml: toml, endpoint: endpoint, runID: runID, dir: dir, pattern: pattern,
		metrics: metrics.Path(pattern, 0), nnodes: nnodes}
}

// start starts one agent as node name with 2 workers.
func (j *faultJob) start(name string, extra ...string) *gorunProc {
	j.t.Helper()
	args := []string{"--nnodes=" + j.nnodes, "--nproc-per-node=2", "--rdzv-backend=etcd", "--rdzv-endpoint=" + j.endpoint,
		"--rdzv-id=" + j.runID, "--node-name=" + name, "--local-addr=127.0.0.1", "--max-restarts=5", "--term-timeout=5s",
		fmt.Sprintf("--rdzv-conf=lease_ttl=%d,last_call_timeout=%d,join_timeout=120", cmp.Or(j.leaseTTL, 2), cmp.Or(j.lastCall, 10))}
	args = append(append(args, extra...), j.toml)
	args = append(append(append(args, faultSets...), j.sets...), "--set", fmt.Sprintf("checkpoint.dir=%q", j.dir), "--metrics", j.pattern)
	p := startGorun(j.t, name, j.env, args...)
	j.agents = append(j.agents, p)
	return p
}

// records reads the metrics file's final line of steps, ignoring a last
// line still being written.
func (j *faultJob) records() []metrics.Record {
	recs, _ := harness.Records(j.metrics)
	return recs
}

// waitStep waits until rank 0 logged step or a later one, and returns the last record.
func (j *faultJob) waitStep(step int) metrics.Record {
	j.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		if recs := j.records(); len(recs) > 0 && recs[len(recs)-1].Step >= step {
			return recs[len(recs)-1]
		}
		time.Sleep(2 * time.Millisecond)
	}
	j.t.Fatalf("%s: no step %d within 90 s", j.runID, step)
	return metrics.Record{}
}

// roundsEnded counts the "round ended" lines of every agent.
func (j *faultJob) roundsEnded() int {
	n := 0
	for _, a := range j.agents {
		n += strings.Count(a.stderr.String(), `"message":"round ended`)
	}
	return n
}

// faultRow is one line of docs/benchmarks.md's fault matrix.
type faultRow struct {
	Scenario         string
	Detect, Resume   time.Duration
	AtStep, FromStep int
	Result           string
}

func (r faultRow) String() string {
	if r.Resume == 0 {
		return fmt.Sprintf("| %s | - | - | - | %s |", r.Scenario, r.Result)
	}
	return fmt.Sprintf("| %s | %.1f s | %.1f s | %d (step %d, resumed after %d) | %s |", r.Scenario,
		r.Detect.Seconds(), r.Resume.Seconds(), r.AtStep-r.FromStep, r.AtStep, r.FromStep, r.Result)
}

// observe measures a fault injected at the moment at, when rank 0 had logged step atStep and
// recsBefore records, with endedBefore "round ended" lines: time to the next "round ended" line
// of any agent (detect), and to the first metrics record after it (resume, whose step - 1 is the
// checkpoint resumed from).
func (j *faultJob) observe(scenario string, at time.Time, atStep, endedBefore int) faultRow {
	j.t.Helper()
	row := faultRow{Scenario: scenario, AtStep: atStep}
	deadline := time.Now().Add(90 * time.Second)
	var atDetect []metrics.Record
	for time.Now().Before(deadline) {
		if row.Detect == 0 && j.roundsEnded() > endedBefore {
			row.Detect = time.Since(at)
			atDetect = j.records()
			if len(atDetect) > 0 {
				row.AtStep = max(row.AtStep, atDetect[len(atDetect)-1].Step)
			}
		}
		if row.Detect != 0 {
			if rec, ok := firstNew(atDetect, j.records()); ok {
				row.Resume = time.Since(at)
				row.FromStep = rec.Step - 1
				return row
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, a := range j.agents {
		j.t.Logf("%s stdout:\n%s\n%s stderr:\n%s", a.name, harness.Tail(a.stdout.String(), 30), a.name, harness.Tail(a.stderr.String(), 40))
	}
	j.t.Logf("records: %d at detection, %d now", len(atDetect), len(j.records()))
	j.t.Fatalf("%s: no round ended and training resumed within 90 s of the fault (detected after %v)", scenario, row.Detect)
	return row
}

// firstNew returns the first record of now that was not in before. The resumed round first drops
// the records of the steps it redoes, then appends: its first record is the first one that is not
// the record before held at the same place.
func firstNew(before, now []metrics.Record) (metrics.Record, bool) {
	for i, r := range now {
		if i >= len(before) || !sameRecord(r, before[i]) {
			return r, true
		}
	}
	return metrics.Record{}, false
}

// sameRecord says whether a and b are the same line of the metrics file: the same step, time,
// loss, learning rate, throughput, world size and elapsed time.
func sameRecord(a, b metrics.Record) bool {
	return a.Step == b.Step && a.Time.Equal(b.Time) && a.Loss == b.Loss && a.LR == b.LR &&
		a.TokensPerS == b.TokensPerS && a.WorldSize == b.WorldSize && a.ElapsedS == b.ElapsedS
}

// stepsRedone reads the metrics file at path as the trainer wrote it, the records of steps that
// a later world trained again included, and returns the job's final line of steps
// (metrics.History) and how many steps were trained more than once: the records History leaves
// out (a step trained three times counts twice). Every fault test counts the steps a fault cost
// here, from the raw records: records the test cleaned of superseded ones could not show a
// redone step.
func stepsRedone(t *testing.T, path string) ([]metrics.Record, int) {
	t.Helper()
	recs, err := metrics.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	line := metrics.History(recs)
	return line, len(recs) - len(line)
}

// fault is a change the test made to the job's world: the round whose world it broke (or grew)
// and the ranks of that round it took away (none when a node joins).
type fault struct {
	round int
	lost  []int
	// copyInFlight: the lost state comes from the memory copies ([checkpoint] memory, a copy
	// every step), which a rank sends in the background after a step: the copy of the step
	// before the fault may not have been committed yet, and then the job goes on from the step
	// before it. Such a fault may cost one step more.
	copyInFlight bool
}

// lastInRound is the last step rank completed in round: the step of the last record of that
// round and rank in the rank's own metrics file, -1 when it holds none. (A rank writes its
// record when it completes a step; a re-formed worker may also write its last record of the old
// round into its new rank's file, which the rank field tells apart.)
func (j *faultJob) lastInRound(rank, round int) int {
	j.t.Helper()
	recs, err := metrics.ReadFile(metrics.Path(j.pattern, rank))
	if err != nil {
		return -1
	}
	last := -1
	for _, r := range recs {
		if r.Round == round && r.Rank == rank {
			last = max(last, r.Step)
		}
	}
	return last
}

// round is the round of the world that wrote rank 0's last record so far.
func (j *faultJob) round() int {
	j.t.Helper()
	recs, err := metrics.ReadFile(j.metrics)
	if err != nil {
		j.t.Fatal(err)
	}
	return recs[len(recs)-1].Round
}

// requireRedone fails t unless rank 0's metrics hold each of steps 1..last once in the job's
// line of steps, and the job trained again exactly the steps that no fault could keep: for each
// fault, those rank 0 had completed past the lowest step a surviving rank of the fault's world
// had completed (the steps every survivor completed are kept; a fault between two steps, where
// every survivor completed the same one, costs none), which is at most the one step in flight
// when it struck (and one more for a fault whose lost state comes from memory copies of which
// the last may have been in flight: fault.copyInFlight). The steps redone are counted from rank
// 0's raw records (stepsRedone). It returns them.
func (j *faultJob) requireRedone(faults ...fault) int {
	j.t.Helper()
	line, redone := stepsRedone(j.t, j.metrics)
	last := cmp.Or(j.steps, 40)
	for i, r := range line {
		if r.Step != i+1 {
			j.t.Fatalf("%s: the job's line of steps has step %d at place %d: want each of steps 1..%d once, in order", j.runID, r.Step, i+1, last)
		}
	}
	if len(line) != last {
		j.t.Fatalf("%s: the job's line of steps ends at step %d, want %d", j.runID, len(line), last)
	}
	want, slack := 0, 0
	var why []string
	for _, f := range faults {
		recs, _ := metrics.ReadFile(j.metrics)
		size := 0
		for _, r := range recs {
			if r.Round == f.round {
				size = max(size, r.WorldSize)
			}
		}
		if size == 0 {
			j.t.Fatalf("%s: rank 0 recorded no step in round %d, the round of a fault", j.runID, f.round)
		}
		done0, low := j.lastInRound(0, f.round), math.MaxInt
		var lasts []string
		for r := range size {
			d := j.lastInRound(r, f.round)
			lasts = append(lasts, fmt.Sprintf("%d:%d", r, d))
			if !slices.Contains(f.lost, r) {
				if d < 0 {
					j.t.Fatalf("%s: surviving rank %d recorded no step in round %d", j.runID, r, f.round)
				}
				low = min(low, d)
			}
		}
		cost := max(0, done0-low) // rank 0 lost behind the survivors: its successor records the steps it missed
		if cost > 1 {
			j.t.Errorf("%s: in round %d the surviving ranks' last steps differ by %d (rank:step %s): ranks may differ by one step at most", j.runID, f.round, cost, strings.Join(lasts, " "))
		}
		want += cost
		if f.copyInFlight {
			slack++
			cost1 := fmt.Sprintf("%d, or %d when the copy of the last step was in flight", cost, cost+1)
			why = append(why, fmt.Sprintf("round %d lost ranks %v (their state from the memory copies), last step completed by rank:step %s: %s", f.round, f.lost, strings.Join(lasts, " "), cost1))
			continue
		}
		why = append(why, fmt.Sprintf("round %d lost ranks %v, last step completed by rank:step %s: %d", f.round, f.lost, strings.Join(lasts, " "), cost))
	}
	j.t.Logf("%s: %d step(s) redone (raw records of rank 0), want %d to %d: %s", j.runID, redone, want, want+slack, strings.Join(why, "; "))
	if redone < want || redone > want+slack {
		j.t.Errorf("%s: the job trained %d step(s) again (%d records of rank 0, %d steps), want %d to %d: only the steps a surviving rank had not completed (%s)",
			j.runID, redone, len(line)+redone, len(line), want, want+slack, strings.Join(why, "; "))
	}
	return redone
}

// nodeRank is the node rank agent a had in round, from its "agent state" log line of that
// round's start.
func nodeRank(t *testing.T, a *gorunProc, round int) int {
	t.Helper()
	for _, l := range strings.Split(a.stderr.String(), "\n") {
		var e struct {
			Msg      string `json:"message"`
			To       string `json:"to"`
			Round    *int   `json:"round"`
			NodeRank *int   `json:"node_rank"`
		}
		if json.Unmarshal([]byte(l), &e) == nil && e.Msg == "agent state" && e.To == "running" && e.Round != nil && *e.Round == round && e.NodeRank != nil {
			return *e.NodeRank
		}
	}
	t.Fatalf("%s: no agent state line of round %d with its node rank", a.name, round)
	return 0
}

// byNodeRank is the live agents that had a node rank in round, in node-rank order: a test kills
// the last (never rank 0's node, whose records are the job's).
func (j *faultJob) byNodeRank(round int) []*gorunProc {
	j.t.Helper()
	var out []*gorunProc
	for _, a := range j.agents {
		if a.cmd.ProcessState == nil {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(a, b *gorunProc) int { return nodeRank(j.t, a, round) - nodeRank(j.t, b, round) })
	return out
}

// ranksOf is the global ranks of agent a's 2 workers in round.
func ranksOf(t *testing.T, a *gorunProc, round int) []int {
	t.Helper()
	n := nodeRank(t, a, round)
	return []int{2 * n, 2*n + 1}
}

// inPlaceLine is rank 0's line for a world re-formed in place: the round, the step it went on
// from and the steps its exchange says were redone.
var inPlaceLine = regexp.MustCompile(`trainer: round (\d+): re-formed in place at world size (\d+): state of step (\d+) from peers \(\d+ bytes received here, (\d+) step\(s\) redone\)`)

// requireInPlace fails t unless rank 0 said once that the world broken in round re-formed in
// place at world size size from its peers' state (no checkpoint), going on from the step its
// own records go on from with the steps redone its records show.
func (j *faultJob) requireInPlace(round, size, redone int) {
	j.t.Helper()
	recs, err := metrics.ReadFile(j.metrics)
	if err != nil {
		j.t.Fatal(err)
	}
	from := -1
	for _, r := range recs {
		if r.Round > round {
			from = r.Step - 1
			break
		}
	}
	lines := inPlaceLine.FindAllStringSubmatch(j.stdoutOf(), -1)
	want := []string{strconv.Itoa(size), strconv.Itoa(from), strconv.Itoa(redone)}
	if len(lines) != 1 || !slices.Equal(lines[0][2:], want) {
		j.t.Errorf("%s: want one line of rank 0 saying the world re-formed in place at world size %d from peers' state of step %d, %d step(s) redone; got %q",
			j.runID, size, from, redone, lines)
	}
}

// finish waits for the agents that were not killed: each must exit 0, rank 0 must have logged
// the last step (40 unless j.steps) last, and no process of the run may be left (gorunProc.wait checks).
func (j *faultJob) finish(killed ...*gorunProc) {
	j.t.Helper()
	for _, a := range j.agents {
		r := a.wait()
		isKilled := false
		for _, k := range killed {
			isKilled = isKilled || k == a
		}
		if !isKilled && r.ExitCode != 0 {
			j.t.Errorf("%s: exit %d, want 0", a.name, r.ExitCode)
		}
	}
	last := cmp.Or(j.steps, 40)
	if recs := j.records(); len(recs) == 0 || recs[len(recs)-1].Step != last {
		j.t.Fatalf("%s: the run did not end with step %d", j.runID, last)
	}
}

// status is gorun status of the job.
func (j *faultJob) status() string {
	j.t.Helper()
	return runGorun(j.t, nil, "status", "--rdzv-endpoint="+j.endpoint, "--rdzv-id="+j.runID).Stdout
}

// worker is one worker process of a fault job: its pid, the global rank it started with (a
// worker kept in place across rounds keeps its first RANK in its environment), its local rank
// and its agent.
type worker struct {
	pid, rank, local int
	agent            *gorunProc
}

// workers lists the worker processes of the job's live agents (children of an agent, with a
// RANK in their environment).
func (j *faultJob) workers() []worker {
	var out []worker
	for _, a := range j.agents {
		if a.cmd.ProcessState != nil {
			continue
		}
		for _, p := range harness.Marked(markerEnv + "=" + a.marker) {
			if p.PPID != a.cmd.Process.Pid {
				continue
			}
			rank, ranked := p.Getenv("RANK")
			if !ranked {
				continue
			}
			w := worker{pid: p.PID, agent: a}
			w.rank, _ = strconv.Atoi(rank)
			if local, ok := p.Getenv("LOCAL_RANK"); ok {
				w.local, _ = strconv.Atoi(local)
			}
			out = append(out, w)
		}
	}
	return out
}

// pause stops (SIGSTOP) every worker of the job and returns them once every thread of each is
// stopped (kill only queues the signal): the job cannot step past the fault the test injects
// next, however fast this machine trains, and what the workers wrote stays as it is until the
// test continues them with resume or resumeOnceRoundSent.
func (j *faultJob) pause() []worker {
	j.t.Helper()
	ws := j.workers()
	if len(ws) == 0 {
		j.t.Fatalf("%s: no worker to pause", j.runID)
	}
	for _, w := range ws {
		_ = syscall.Kill(w.pid, syscall.SIGSTOP)
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, w := range ws {
		for !harness.Stopped(w.pid) {
			if time.Now().After(deadline) {
				j.t.Fatalf("%s: worker %d (rank %d) not stopped 60 s after SIGSTOP", j.runID, w.pid, w.rank)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return ws
}

// kill runs kill, the fault of a test, and returns when it ran: with paused, between steps
// (every worker stopped first, by pause, and continued after), else mid-step (the workers
// running). kill runs on the caller's goroutine, so it may fail the test.
func (j *faultJob) kill(paused bool, kill func()) time.Time {
	j.t.Helper()
	var ws []worker
	if paused {
		ws = j.pause()
	}
	at := time.Now()
	kill()
	resume(ws)
	return at
}

// pauseBetweenCheckpoints pauses every worker at a moment when no checkpoint newer than the
// newest complete one can complete without ranks the test then kills, and returns them with
// that checkpoint's step. A save of step s starts with rank 0's broadcast, after rank 0 logged
// step s, and completes only once every rank has reported its part: so while rank 0 has not
// logged newest+every, no rank has reported for a newer checkpoint. Past that (a save under
// way), it lets the job go on one step and looks again.
func (j *faultJob) pauseBetweenCheckpoints(every int) ([]worker, int64) {
	j.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		paused := j.pause()
		newest := newestStep(j.t, j.dir)
		recs := j.records()
		if len(recs) > 0 && int64(recs[len(recs)-1].Step) < newest+int64(every) {
			return paused, newest
		}
		resume(paused)
		j.waitStep(recs[len(recs)-1].Step + 1)
	}
	j.t.Fatalf("%s: no pause between two checkpoints within 90 s", j.runID)
	return nil, 0
}

// resume continues paused workers, except those of the given ranks.
func resume(ws []worker, except ...int) {
	for _, w := range ws {
		if !slices.Contains(except, w.rank) {
			_ = syscall.Kill(w.pid, syscall.SIGCONT)
		}
	}
}

// restartedAlone is what an agent reports on its stderr when it restarts a failed worker of
// global rank `rank` alone and keeps every other worker of the job in place.
func restartedAlone(rank int) string {
	return fmt.Sprintf("restarting rank %d alone, the other workers go on in place", rank)
}

// requireFirstFailure: gorun status counts restarts restarts after worker failures and its first
// listed failure matches first.
func requireFirstFailure(t *testing.T, status string, restarts int, first string) {
	t.Helper()
	re := regexp.MustCompile(`failures \(\d+, first first[^\n]*\n\s+round 0: ` + first)
	if !strings.Contains(status, fmt.Sprintf("restarts used: %d of 5 after worker failures", restarts)) || !re.MatchString(status) {
		t.Errorf("gorun status does not count %d restart(s) after worker failures and name the first failure %q:\n%s", restarts, first, status)
	}
}

// requireNormClose: the newest checkpoints of ref and got are within 1e-5 relative by the L2
// norm of the difference per group (params, optim.m, optim.v), the measure across world sizes.
func requireNormClose(t *testing.T, ref, got string) string {
	t.Helper()
	rel := normDiff(t, ref, got)
	for g, v := range rel {
		if v > 1e-5 {
			t.Errorf("%s vs %s: %s differ by %.2e relative (L2), want <= 1e-5", got, ref, g, v)
		}
	}
	return fmt.Sprintf("within %.0e (L2, params %.1e)", 1e-5, rel["params"])
}

// TestFaults is issue 6's fault matrix on real processes: three agents of 2 workers each train
// 40 steps of the embedded trainer over a real etcd while a fault is injected at a chosen step;
// each run reaches step 40, its final checkpoint equals a fault-free reference (bit-identical
// when it ends at world size 6 after restarts from world-size-6 checkpoints, else within 1e-5
// by the L2 norm of the difference), no process is left, and the restart count and failure
// report name the right rank and node. A worker or node lost is recovered in place, and the
// steps redone, counted from rank 0's raw metrics records, are only the step in flight, none
// when every survivor had completed the same step (requireRedone); the worker and node kills are
// tried paused and mid-step. The measured rows are logged for docs/benchmarks.md.
func TestFaults(t *testing.T) {
	toml := trainerToml(t)
	root := t.TempDir()
	endpoint := etcdtest.Start(t).Endpoints()[0]
	var rows []faultRow
	t.Cleanup(func() {
		t.Logf("fault matrix:\n| scenario | time to detect | time to resume | steps lost | result |\n|---|---|---|---|---|\n%s",
			strings.Join(func() []string {
				var s []string
				for _, r := range rows {
					s = append(s, r.String())
				}
				return s
			}(), "\n"))
	})

	// Fault-free references at the two final world sizes.
	ref6 := newFaultJob(t, toml, endpoint, "ref6", root, "2:3")
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		ref6.start(n)
	}
	ref6.finish()
	ref4 := newFaultJob(t, toml, endpoint, "ref4", root, "2")
	for _, n := range []string{"node-a", "node-b"} {
		ref4.start(n)
	}
	ref4.finish()
	if t.Failed() {
		t.FailNow()
	}

	three := func(t *testing.T, runID string, extra ...string) *faultJob {
		j := newFaultJob(t, toml, endpoint, runID, root, "2:3")
		for _, n := range []string{"node-a", "node-b", "node-c"} {
			j.start(n, extra...)
		}
		return j
	}

	// Where a kill lands. Paused: every worker is stopped (SIGSTOP) once rank 0 recorded step 12,
	// killed, and continued, so no rank steps on past the kill: the ranks are wherever the stop
	// found them, at most one step apart. Mid-step: the kill comes as soon as the test sees rank
	// 0's record of step 12 (the victim was chosen a step before), every worker running: each is
	// inside a later step, computing or in one of its collectives (the victim may have sent its
	// part of the step's statistics, and then some survivors complete the step and others
	// cannot). Either way the fault may cost only the step in flight (requireRedone).
	kills := []struct {
		name   string
		paused bool
	}{{"paused", true}, {"mid-step", false}}

	for _, k := range kills {
		t.Run("kill -9 worker "+k.name, func(t *testing.T) {
			j := three(t, "kill-worker-"+k.name)
			// The victim is chosen a step before, so that the kill follows rank 0's record at once.
			j.waitStep(11)
			round := j.round()
			agent := j.byNodeRank(round)[1]
			var pid int
			for _, w := range j.workers() {
				if w.agent == agent && w.local == 0 {
					pid = w.pid
				}
			}
			rank := 2 * nodeRank(t, agent, round) // 2: its local rank 0
			ended := j.roundsEnded()
			rec := j.waitStep(12)
			at := j.kill(k.paused, func() {
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}) // no step completes without the victim now
			row := j.observe(fmt.Sprintf("kill -9 of a worker (rank %d), %s", rank, k.name), at, rec.Step, ended)
			j.finish()
			redone := j.requireRedone(fault{round: round, lost: []int{rank}})
			requireEqual(t, ref6.dir, j.dir)
			// In place, not a restart from the step-10 checkpoint (which a deterministic trainer
			// would also bring to the same bits): no checkpoint read, and rank 0 says it re-formed
			// in place from its peers' state, at the step and with the steps redone its records show.
			requireNoCheckpointRead(t, j)
			j.requireInPlace(round, 6, redone)
			st := j.status()
			requireFirstFailure(t, st, 1, fmt.Sprintf(`rank %d on %s \(node \d\): SIGKILL`, rank, agent.name))
			// Issue 21: the worker is restarted alone; every other worker goes
			// on in place (the recovery is an in-place one, not a restart).
			if !strings.Contains(j.stderrOf(), restartedAlone(rank)) {
				t.Errorf("no agent reported %q", restartedAlone(rank))
			}
			if !strings.Contains(st, fmt.Sprintf("in-place recoveries (workers kept, not restarted): 1; last: round %d: worker failure: rank %d on %s", round+1, rank, agent.name)) {
				t.Errorf("gorun status shows no in-place recovery of the killed worker alone:\n%s", st)
			}
			row.FromStep = row.AtStep - redone
			row.Result = fmt.Sprintf("restarted alone, the others in place (%d step(s) redone, from the raw records); finished, bit-identical (--rtol 0)", redone)
			rows = append(rows, row)
		})
	}

	for _, k := range kills {
		t.Run("kill -9 node "+k.name, func(t *testing.T) {
			j := three(t, "kill-node-"+k.name)
			j.waitStep(11)
			round := j.round()
			victim := j.byNodeRank(round)[2]
			lost := ranksOf(t, victim, round)
			ended := j.roundsEnded()
			rec := j.waitStep(12)
			at := j.kill(k.paused, func() {
				if err := victim.cmd.Process.Kill(); err != nil {
					t.Fatal(err)
				}
			}) // its workers die with it: no step completes without them
			row := j.observe("kill -9 of a node (agent and its 2 workers), "+k.name, at, rec.Step, ended)
			j.finish(victim)
			redone := j.requireRedone(fault{round: round, lost: lost})
			requireNoCheckpointRead(t, j)
			row.FromStep = row.AtStep - redone
			row.Result = fmt.Sprintf("in place (%d step(s) redone), finished at world size 4, ", redone) + requireNormClose(t, ref4.dir, j.dir)
			st := j.status()
			// The peers' workers fail first (their connections to the dead node
			// break); once its lease expires the restart is the node loss's,
			// and the lost node is the first failure.
			if !strings.Contains(st, "restarts used: 0 of 5 after worker failures, 1 of 10 after membership changes") ||
				!strings.Contains(st, "node "+victim.name+" lost at") || strings.Contains(st, victim.name+"  ") {
				t.Errorf("gorun status does not charge the restart to the loss of %s and name it:\n%s", victim.name, st)
			}
			rows = append(rows, row)
		})
	}

	t.Run("SIGSTOP worker", func(t *testing.T) {
		// --snapshots=false: this case measures the checkpoint path; with the workers' saves in
		// the agent's memory the restarted workers take over their own state instead.
		j := three(t, "sigstop", "--heartbeat-timeout=2s", "--snapshots=false")
		rec := j.waitStep(12)
		ended := j.roundsEnded()
		at := time.Now()
		paused := j.pause()
		round := j.round()
		agent := j.byNodeRank(round)[1]
		rank := 2 * nodeRank(t, agent, round) // 2: its local rank 0
		var stopped int
		for _, w := range paused {
			if w.agent == agent && w.local == 0 {
				stopped = w.pid
			}
		}
		for _, w := range paused {
			if w.pid != stopped {
				_ = syscall.Kill(w.pid, syscall.SIGCONT)
			}
		}
		// rank 2 stays stopped: no step completes without it
		row := j.observe(fmt.Sprintf("SIGSTOP of a worker (rank %d, --heartbeat-timeout=2s)", rank), at, rec.Step, ended)
		j.finish()
		// Which recovery follows is a race between the agents, and either is right. Usually every
		// worker stalls with the stopped one, so every agent sees hung workers (elastic's
		// respawnable and keepable refuse a worker whose heartbeat stalled) and restarts its
		// workers; the job resumes from the newest checkpoint and redoes every step rank 0
		// recorded past it. On a loaded machine the stopped worker's agent may judge it before its
		// peers' heartbeats count as stalled: then it is restarted alone, the others go on in place
		// and the new process takes its slice from its peers, at most the step in flight redone.
		var from int
		_, redone := stepsRedone(t, j.metrics)
		how := ""
		if inPlace := strings.Contains(j.stderrOf(), restartedAlone(rank)); inPlace {
			requireNoCheckpointRead(t, j)
			if redone > 1 {
				t.Errorf("%d step(s) redone in place, want at most the step in flight", redone)
			}
			from = j.lastInRound(0, round) - redone
			how = fmt.Sprintf("restarted alone, the others in place (%d step(s) redone)", redone)
		} else {
			m := regexp.MustCompile(`checkpoint: loading step-\d+: resuming at step (\d+)`).FindStringSubmatch(j.stdoutOf())
			if m == nil {
				t.Fatalf("no worker resumed from a checkpoint after the hang, and none was restarted alone")
			}
			from, _ = strconv.Atoi(m[1])
			if want := j.lastInRound(0, round) - from; redone != want {
				t.Errorf("%d step(s) redone (raw records of rank 0), want %d: rank 0 recorded step %d and the job resumed at step %d", redone, want, j.lastInRound(0, round), from)
			}
			how = fmt.Sprintf("every worker restarted from the checkpoint of step %d (%d step(s) redone)", from, redone)
		}
		requireEqual(t, ref6.dir, j.dir)
		st := j.status()
		t.Logf("status after the hang:\n%s", st)
		// Every worker waits in a collective for the stopped one, so all stop stepping at once; the
		// agents blame the one that is stopped (state T), and the others wait for that.
		requireFirstFailure(t, st, 1, fmt.Sprintf(`rank %d on %s \(node \d\): SIGKILL \(exit 137\) at \S+: no progress for 2[.0-9]*s after step \d+ \(heartbeat timeout\); the process was stopped`, rank, agent.name))
		row.FromStep = row.AtStep - redone
		row.Result = fmt.Sprintf("killed by its agent; %s; finished, bit-identical (--rtol 0)", how)
		rows = append(rows, row)
	})

	t.Run("corrupt newest checkpoint", func(t *testing.T) {
		j := three(t, "corrupt", "--snapshots=false") // the checkpoint fallback, not the saves
		rec := j.waitStep(17)
		// Ranks 1, 3 and 5 hold shard 1 of the model in the job's 3 replicas x 2 shards: killed
		// together, no live rank covers it, so the workers restarted alone and the others resume
		// from the newest checkpoint (issue 21: only then). Every worker is stopped while the
		// newest checkpoint is corrupted, at a moment when no newer one can complete without the
		// holders; they are killed before the others go on, so the resume must skip the corrupt
		// checkpoint.
		paused, newest := j.pauseBetweenCheckpoints(5)
		round := j.round()
		holders := []int{1, 3, 5}
		shards, _ := filepath.Glob(filepath.Join(j.dir, checkpoint.StepName(newest), "shard-*.bin"))
		if len(shards) == 0 {
			t.Fatalf("no shard in checkpoint step %d", newest)
		}
		b, err := os.ReadFile(shards[0])
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0x01
		if err := os.WriteFile(shards[0], b, 0o644); err != nil {
			t.Fatal(err)
		}
		ended := j.roundsEnded()
		at := time.Now()
		for _, w := range paused {
			if slices.Contains(holders, w.rank) {
				if err := syscall.Kill(w.pid, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
		}
		resume(paused, holders...)
		row := j.observe(fmt.Sprintf("corrupt newest checkpoint (step %d), then kill -9 of the 3 workers holding a shard", newest), at, rec.Step, ended)
		j.finish()
		var out string
		for _, a := range j.agents {
			out += a.stdout.String()
		}
		want := fmt.Sprintf("checkpoint %s is corrupt", checkpoint.StepName(newest))
		if !strings.Contains(out, want) || row.FromStep != int(newest)-5 {
			t.Errorf("want %q in the log and a resume from step %d, resumed from %d", want, newest-5, row.FromStep)
		}
		// Back to the checkpoint before the corrupt one: every step rank 0 recorded past it is redone.
		if _, redone := stepsRedone(t, j.metrics); redone != j.lastInRound(0, round)-(int(newest)-5) {
			t.Errorf("%d step(s) redone (raw records of rank 0), want %d: rank 0 recorded step %d and the job went on from step %d",
				redone, j.lastInRound(0, round)-(int(newest)-5), j.lastInRound(0, round), newest-5)
		}
		requireEqual(t, ref6.dir, j.dir)
		// One restart: the first failure opens the round, the others find it open.
		requireFirstFailure(t, j.status(), 1, `rank [135] on node-[abc] \(node \d\): SIGKILL`)
		row.Result = "no live copy: resumed from the checkpoint before the corrupt one (logged), finished, bit-identical (--rtol 0)"
		rows = append(rows, row)
	})

	t.Run("node back (scale up)", func(t *testing.T) {
		j := three(t, "scale-up")
		j.waitStep(8)
		lossRound := j.round()
		victim := j.byNodeRank(lossRound)[2]
		lost := ranksOf(t, victim, lossRound)
		// Killed mid-step, every worker running.
		if err := victim.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		victim.wait()
		deadline := time.Now().Add(60 * time.Second)
		var rec metrics.Record
		for time.Now().Before(deadline) {
			if recs := j.records(); len(recs) > 0 && recs[len(recs)-1].WorldSize == 4 && recs[len(recs)-1].Step >= 17 {
				rec = recs[len(recs)-1]
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if rec.Step == 0 {
			t.Fatal("no step 17 at world size 4 within 60 s of the node loss")
		}
		// Paused, the job cannot finish at world size 4 before node-d joins: the workers go on
		// only once their agents sent them the round with node-d (they re-form in place).
		paused := j.pause()
		joinRound := j.round()
		survivors := j.byNodeRank(joinRound)
		ended := j.roundsEnded()
		at := time.Now()
		sent := roundsSent(survivors)
		j.start("node-d")
		j.resumeOnceRoundSent(paused, survivors, sent)
		row := j.observe("a node comes back (scale up 4 -> 6 workers)", at, rec.Step, ended)
		j.finish(victim)
		if recs := j.records(); recs[len(recs)-1].WorldSize != 6 {
			t.Fatalf("the run ended at world size %d, want 6", recs[len(recs)-1].WorldSize)
		}
		// The loss may cost the step in flight; the join none (the running world stops at a step
		// boundary every rank agrees on).
		redone := j.requireRedone(fault{round: lossRound, lost: lost}, fault{round: joinRound})
		requireNoCheckpointRead(t, j)
		row.FromStep = row.AtStep
		row.Result = fmt.Sprintf("in place (%d step(s) redone in all, the node loss's), finished at world size 6, ", redone) + requireNormClose(t, ref6.dir, j.dir)
		st := j.status()
		// Two membership changes: node-c lost (its peers' worker failures
		// are charged to that), node-d joined.
		if !strings.Contains(st, "node-d") || !strings.Contains(st, "0 of 5 after worker failures, 2 of 10 after membership changes") {
			t.Errorf("gorun status does not show node-d and two membership changes:\n%s", st)
		}
		rows = append(rows, row)
	})

	t.Run("embedded etcd member lost", func(t *testing.T) {
		jobID := fmt.Sprint(910000 + time.Now().UnixNano()%89989)
		j := newFaultJob(t, toml, "", "embedded", root, "2:3")
		for id := range 3 {
			args := append([]string{"--nnodes=2:3", "--nproc-per-node=2", "--max-restarts=5", "--term-timeout=5s",
				"--rdzv-conf=lease_ttl=5,last_call_timeout=10,join_timeout=60", toml}, faultSets...)
			args = append(args, "--set", fmt.Sprintf("checkpoint.dir=%q", j.dir), "--metrics", j.pattern)
			j.agents = append(j.agents, startGorun(t, fmt.Sprintf("node%d", id+1), slurmStepEnv(jobID, id), args...))
		}
		rec := j.waitStep(12)
		victim := j.agents[0] // hosts the first etcd member and node rank 0
		round := j.round()
		lost := ranksOf(t, victim, round)
		ended := j.roundsEnded()
		at := time.Now()
		if err := victim.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		row := j.observe("kill -9 of the node hosting an embedded etcd member (SLURM, 3 members)", at, rec.Step, ended)
		j.finish(victim)
		// Killed mid-step, every worker running: at most the step in flight is redone.
		redone := j.requireRedone(fault{round: round, lost: lost})
		requireNoCheckpointRead(t, j)
		row.FromStep = row.AtStep - redone
		row.Result = fmt.Sprintf("in place (%d step(s) redone), finished at world size 4 on 2 etcd members, ", redone) + requireNormClose(t, ref4.dir, j.dir)
		for _, a := range j.agents[1:] {
			if !strings.Contains(a.stderr.String(), "worker failure (attempt 0)") && !strings.Contains(a.stderr.String(), "round ended") {
				t.Errorf("%s: no restart reported", a.name)
			}
		}
		rows = append(rows, row)
	})

	t.Run("checkpoint disk full", func(t *testing.T) {
		if os.Geteuid() != 0 {
			testutil.SkipOrFail(t, "mounting a small tmpfs needs root")
		}
		mnt := filepath.Join(t.TempDir(), "ckpt-fs")
		if err := os.Mkdir(mnt, 0o755); err != nil {
			t.Fatal(err)
		}
		// One checkpoint of this model is 456 KiB: the first fits, the second does not.
		if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=700k"); err != nil {
			testutil.SkipOrFail(t, "mount -t tmpfs: %v", err)
		}
		t.Cleanup(func() {
			if err := syscall.Unmount(mnt, 0); err != nil {
				t.Errorf("unmount %s: %v", mnt, err)
			}
		})
		dir := filepath.Join(mnt, "ckpt")
		args := append([]string{"--nproc-per-node=2", "--max-restarts=0", toml}, faultSets...)
		args = append(args, "--set", fmt.Sprintf("checkpoint.dir=%q", dir), "--set", "checkpoint.keep=1",
			"--metrics", filepath.Join(root, "disk-full.jsonl"))
		r := runGorun(t, nil, args...)
		if r.ExitCode == 0 || !strings.Contains(r.Stderr, "no space left on device") {
			t.Fatalf("exit %d, want a failure saying no space left on device", r.ExitCode)
		}
		if got := newestStep(t, dir); got != 5 {
			t.Fatalf("newest complete checkpoint is step %d, want 5", got)
		}
		c, err := checkpoint.Open(filepath.Join(dir, checkpoint.StepName(5)))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for _, tm := range c.Manifest().Tensors {
			if err := c.Read(tm.Name, 0, make([]float32, tm.Elements())); err != nil {
				t.Fatalf("step 5 after the disk filled: %v", err)
			}
		}
		var line string
		for _, l := range nonEmptyLines(r.Stderr) {
			if strings.Contains(l, "no space left on device") {
				line = strings.TrimSpace(l)
				break
			}
		}
		t.Logf("disk full: %s", line)
		rows = append(rows, faultRow{Scenario: "checkpoint disk full (tmpfs of 700 KiB, keep=1)",
			Result: "clean stop (exit " + strconv.Itoa(r.ExitCode) + ", --max-restarts=0) naming ENOSPC; step 5 intact and readable"})
	})
}
