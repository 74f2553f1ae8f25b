package e2e

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/internal/snapshot"
	"github.com/gorun/gorun/test/harness"
)

// snapshotDirOf is the snapshot directory worker w was started with (snapshot.EnvDir in its
// environment): the one the test gave its agent, or the agent's own where it makes one.
func (j *faultJob) snapshotDirOf(w worker) string {
	j.t.Helper()
	for _, p := range harness.Marked(markerEnv + "=" + w.agent.marker) {
		if p.PID == w.pid {
			if dir, ok := p.Getenv(snapshot.EnvDir); ok && dir != "" {
				return dir
			}
		}
	}
	j.t.Fatalf("%s: worker %d (rank %d) has no %s in its environment", j.runID, w.pid, w.rank, snapshot.EnvDir)
	return ""
}

// pauseAfterSave stops every worker (pause) at a moment when the worker of rank has saved the
// last step it or any other rank completed, and returns them, that worker and the step: killed
// now, it costs no step unless it already sent its part of the next step's statistics (then
// the step in flight). Its slots cannot change while it is stopped, so the newest complete one
// is the last step it saved. At a moment when a rank completed a step past that (the rank's
// save under way, or done and not yet seen), it lets the job go on one step and looks again.
//
// It also checks that the rank saves every step: after its record of step k it saves k, and
// it starts step k+1 only once that save returned, so its newest complete slot is k or k-1 (a
// save under way), and the other, if complete, holds the step before.
func (j *faultJob) pauseAfterSave(rank int) ([]worker, worker, uint64) {
	j.t.Helper()
	for range 20 {
		paused := j.pause()
		round := j.round()
		var victim worker
		for _, w := range paused {
			if w.rank == rank {
				victim = w
			}
		}
		if victim.pid == 0 {
			j.t.Fatalf("no worker of rank %d among %v", rank, paused)
		}
		var steps []uint64
		for _, p := range snapshot.Paths(j.snapshotDirOf(victim), rank) {
			if s, err := snapshot.Verify(p); err == nil {
				steps = append(steps, s.Step)
			}
		}
		slices.Sort(steps)
		if len(steps) == 0 {
			j.t.Fatalf("rank %d saved nothing", rank)
		}
		saved, mine, done0 := steps[len(steps)-1], j.lastInRound(rank, round), j.lastInRound(0, round)
		if int(saved) < mine-1 || len(steps) == 2 && steps[0] != saved-1 {
			j.t.Fatalf("rank %d recorded step %d and its slots hold steps %v: want its last step or the one before, and the step before that", rank, mine, steps)
		}
		if mine <= int(saved) && done0 <= int(saved) {
			return paused, victim, saved
		}
		resume(paused)
		j.waitStep(done0 + 1)
	}
	j.t.Fatalf("%s: in 20 tries, no pause found rank %d's save of the last step done", j.runID, rank)
	return nil, worker{}, 0
}

// TestTrainerSnapshots is issue 33's item 6 on real processes: a one-node job of the embedded
// trainer (2 workers over a real etcd, hsdp: one replica of 2 shards, so the shard of rank 1
// lives in rank 1 alone; no [checkpoint] memory; a checkpoint every 5 steps it could go back
// to) whose worker of rank 1 is SIGKILLed mid-training goes on in place: the agent restarts
// that worker alone, which offers the state its predecessor saved after each step in the
// snapshot directory, and the survivor keeps its own. No checkpoint is read, and the final
// checkpoint is bit-identical to a fault-free run's.
//
// The kill comes while every worker is stopped, at a moment when rank 1 had saved the last step
// any rank completed (pauseAfterSave). Nothing is redone then, unless rank 1 had already sent
// its part of the next step's statistics, which lets rank 0 complete that step (the step in
// flight; rank 1 saves each step before it sends anything for the next): the test asserts the
// exact count, rank 0's last step of that round less rank 1's newest saved step, at most 1.
//
// The workers get the directory through the agent's environment (GORUN_SNAPSHOT_DIR, which
// they inherit; the test makes it and t.TempDir removes it); an agent that makes its own
// directory overrides it, and the test reads the one each worker was given.
func TestTrainerSnapshots(t *testing.T) {
	toml := trainerToml(t)
	root := t.TempDir()
	endpoint := etcdtest.Start(t).Endpoints()[0]
	job := func(runID string) *faultJob {
		j := newFaultJob(t, toml, endpoint, runID, root, "1")
		j.sets, j.steps, j.lastCall = []string{"--set", "train.steps=80"}, 80, 1
		j.env = []string{snapshot.EnvDir + "=" + t.TempDir()}
		return j
	}

	ref := job("snap-ref")
	ref.start("node-a")
	ref.finish()
	if t.Failed() {
		t.FailNow()
	}

	j := job("snap-kill")
	j.start("node-a")
	j.waitStep(12)
	paused, victim, saved := j.pauseAfterSave(1)
	round := j.round()
	if err := syscall.Kill(victim.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	resume(paused, 1)
	j.finish()

	_, redone := stepsRedone(t, j.metrics)
	done0 := j.lastInRound(0, round)
	want := max(0, done0-int(saved))
	t.Logf("rank 1 killed with step %d saved; rank 0 completed step %d in round %d: %d step(s) redone (raw records of rank 0), want %d",
		saved, done0, round, redone, want)
	if redone != want || want > 1 {
		t.Errorf("%d step(s) redone, want %d (rank 0 completed step %d, rank 1 had saved step %d; they differ by one step at most)",
			redone, want, done0, saved)
	}
	requireNoCheckpointRead(t, j)
	j.requireInPlace(round, 2, redone)
	requireEqual(t, ref.dir, j.dir)
	offered := regexp.MustCompile(`worker rank 1: offering the state its rank saved in \S+: steps? \d+`)
	if !offered.MatchString(j.stderrOf()) {
		t.Errorf("the restarted worker of rank 1 did not say it offered its saved state:\n%s", harness.Tail(j.stderrOf(), 40))
	}
	st := j.status()
	if !strings.Contains(st, fmt.Sprintf("in-place recoveries (workers kept, not restarted): 1; last: round %d: worker failure: rank 1 on node-a", round+1)) {
		t.Errorf("gorun status shows no in-place recovery of the killed worker alone:\n%s", st)
	}
}
