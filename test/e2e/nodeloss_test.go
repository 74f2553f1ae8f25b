package e2e

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/etcdtest"
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
	toml := trainerToml(t)
	endpoint := etcdtest.Start(t).Endpoints()[0]
	j := newFaultJob(t, toml, endpoint, "nl-kill-tree", t.TempDir(), "2:3")
	j.sets, j.steps, j.lastCall = append([]string(nil), inPlaceSets...), 80, 1
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		j.start(n)
	}
	rec := j.waitStep(20)
	paused := j.pause()
	survivors, victim := j.agents[:2], j.agents[2]
	before := j.pidsOf(survivors...)
	var victimRanks []int
	at := time.Now()
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, w := range paused {
		if w.agent == victim {
			_ = syscall.Kill(w.pid, syscall.SIGKILL)
			victimRanks = append(victimRanks, w.rank)
		}
	}
	resume(paused, victimRanks...)
	row, after := j.observeWorldSize("kill -9 of a node's agent and workers, in place", at, rec.Step, 4, survivors...)
	j.finish(victim)
	if len(before) != 4 || !slices.Equal(before, after) {
		t.Errorf("the survivors' workers changed: pids %v before the loss, %v at the first step at world size 4", before, after)
		for _, a := range survivors {
			t.Logf("%s stderr:\n%s", a.name, tailLines(a.stderr.String(), 60))
		}
	}
	requireNoCheckpointRead(t, j)
	goal := time.Duration(2+1) * time.Second // lease_ttl=2 (faultJob's) + 1 s
	t.Logf("node loss in place: kill -9 of node-c (agent and workers) at step %d to the first step at world size 4: %.2f s; goal lease TTL + 1 s = %.0f s: %.2fx the goal; survivors' workers %v kept",
		rec.Step, row.Resume.Seconds(), goal.Seconds(), row.Resume.Seconds()/goal.Seconds(), after)
}
