package e2e

import (
	"strings"
	"syscall"
	"testing"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/test/harness"
)

// SLURM delivers its warning (--signal, scancel --signal=USR1) to each node's gorun on its own;
// under load one node's workers can hear of the stop from their peers (the ranks agree on it)
// before its gorun hears of it at all. Here SIGUSR1 reaches node-b's gorun only: every worker of
// both nodes checkpoints the same step and exits 75, and both gorun processes exit 75 asking for
// the requeue. node-a's agent, never signalled, learns that its workers stopped for a requeue
// from their channel and does not take it for a failure (restarting them in place).
func TestRequeueSignalOnOneNode(t *testing.T) {
	j := newFaultJob(t, trainerToml(t), etcdtest.Start(t).Endpoints()[0], "requeue-one", t.TempDir(), "2")
	j.sets = []string{"--set", "train.steps=1000000"}
	a, b := j.start("node-a"), j.start("node-b")
	j.waitStep(5)
	if err := b.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*gorunProc{a, b} {
		r := p.wait()
		if r.ExitCode != 75 || !strings.Contains(r.Stderr, "requeue the job to resume") {
			t.Errorf("%s: exit %d, want 75 and \"requeue the job to resume\"; stderr:\n%s", p.name, r.ExitCode, harness.Tail(r.Stderr, 30))
		}
		if strings.Contains(r.Stderr, "alone") || strings.Contains(r.Stderr, "worker failed") {
			t.Errorf("%s: its agent took the requeue for a failure; stderr:\n%s", p.name, harness.Tail(r.Stderr, 30))
		}
	}
	recs := j.records()
	if at := newestStep(t, j.dir); len(recs) == 0 || int64(recs[len(recs)-1].Step) != at {
		t.Errorf("newest checkpoint is of step %d, want the last step the job took (%d records)", at, len(recs))
	}
}
