package e2e

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/test/harness"
)

// TestNodeLossKeepsEveryWorker is issue 31's node loss in place: three
// agents of two workers of the embedded trainer over one etcd (lease 2 s,
// hsdp, no periodic checkpoint), every worker paused at a step boundary,
// node-c's agent and its workers killed -9 together, the others
// continued. The survivors go on in place at world size 4: every one of
// their worker processes is the one it was before the loss (none
// restarted, alone or with its node), no checkpoint is read, and the job
// ends at its last step. It logs the time from the kill to the first step
// at world size 4 beside its goal, the lease TTL + 1 s (bench/nodeloss.sh
// runs it several times and prints the ratios).
func TestNodeLossKeepsEveryWorker(t *testing.T) {
	tests := []struct {
		name         string
		workersFirst bool // kill node-c's workers before its agent, else after
	}{
		{"agent first", false},
		{"workers first", true},
	}
	toml := trainerToml(t)
	endpoint := etcdtest.Start(t).Endpoints()[0]
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := newFaultJob(t, toml, endpoint, fmt.Sprintf("nl-kill-tree-%d", i), t.TempDir(), "2:3")
			j.sets, j.steps, j.lastCall = append([]string(nil), inPlaceSets...), 80, 1
			for _, n := range []string{"node-a", "node-b", "node-c"} {
				j.start(n)
			}
			rec := j.waitStep(20)
			paused := j.pause()
			survivors, victim := j.agents[:2], j.agents[2]
			before := j.pidsOf(survivors...)
			var victimRanks []int
			killWorkers := func() {
				for _, w := range paused {
					if w.agent == victim {
						_ = syscall.Kill(w.pid, syscall.SIGKILL)
						victimRanks = append(victimRanks, w.rank)
					}
				}
			}
			at := time.Now()
			if tt.workersFirst {
				killWorkers()
			}
			if err := victim.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			if !tt.workersFirst {
				killWorkers()
			}
			resume(paused, victimRanks...)
			row, after := j.observeWorldSize("kill -9 of a node's agent and workers, in place", at, rec.Step, 4, survivors...)
			j.finish(victim)
			if len(before) != 4 || !slices.Equal(before, after) {
				t.Errorf("the survivors' workers changed: pids %v before the loss, %v at the first step at world size 4", before, after)
				for _, a := range survivors {
					t.Logf("%s stderr:\n%s", a.name, harness.Tail(a.stderr.String(), 60))
				}
			}
			requireNoCheckpointRead(t, j)
			goal := time.Duration(2+1) * time.Second // lease_ttl=2 (faultJob's) + 1 s
			t.Logf("node loss in place (%s): kill -9 of node-c (agent and workers) at step %d to the first step at world size 4: %.2f s; goal lease TTL + 1 s = %.0f s: %.2fx the goal; survivors' workers %v before, %v after",
				tt.name, rec.Step, row.Resume.Seconds(), goal.Seconds(), row.Resume.Seconds()/goal.Seconds(), before, after)
		})
	}
}

// TestSLURMDefaultGoesOnAfterNodeLoss is the restart path of the rule
// TestSbatchTrainerFirstNodeLost (test/slurm) checks in place: three agents
// of a faked 3-node SLURM step without --nnodes (launcher.SLURMNodes: the
// first round waits for all 3, later rounds need 1), shell workers that a
// node loss restarts. Killing node1's agent — the first embedded etcd
// member, node rank 0 and the master — restarts the other two at world
// size 4 instead of waiting for a third node SLURM never sends.
func TestSLURMDefaultGoesOnAfterNodeLoss(t *testing.T) {
	jobID := fmt.Sprint(800000 + time.Now().UnixNano()%99991)
	out := t.TempDir()
	var agents []*gorunProc
	for id := range 3 {
		env := append(slurmStepEnv(jobID, id), "OUT="+out)
		agents = append(agents, startGorun(t, fmt.Sprintf("node%d", id+1), env,
			"--nproc-per-node=2", "--term-timeout=5s",
			// A lease must outlive an etcd leader election (the killed
			// node may host the leader): the production TTL, 5 s.
			"--rdzv-conf=lease_ttl=5,join_timeout=60",
			"--", "/bin/sh", "-c", roundWorker))
	}
	waitRound(t, out, 0, 6, 90*time.Second)
	if err := agents[0].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	agents[0].wait()
	waitRound(t, out, 1, 4, 60*time.Second)
	for _, a := range agents[1:] {
		a.cancel()
		if r := a.wait(); r.ExitCode != 143 {
			t.Errorf("%s: exit %d after SIGTERM, want 143", a.name, r.ExitCode)
		}
	}
}
