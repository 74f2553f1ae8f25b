package e2e

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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

// The same race for a PyTorch script whose ranks agree on the stop and leave together (here
// through files, as an all-reduce of a stop flag and a barrier would): SIGUSR1 reaches node-b's
// gorun only, every rank leaves with gorun.exit_for_requeue() (a requeue line on its channel,
// exit 75), and both gorun processes exit 75 asking for the requeue; node-a's, never signalled,
// restarts nothing. node-b's gorun may leave the rendezvous before node-a's worker exits: node-a's
// agent then stops it, and the line it already wrote still makes the round's end a requeue.
func TestRequeueSignalOnOneNodePython(t *testing.T) {
	endpoint := etcdtest.Start(t).Endpoints()[0]
	stop := t.TempDir()
	script := filepath.Join(moduleRoot, "test", "e2e", "testdata", "requeue", "agree.py")
	agents := startAgents(t, []string{"node-a", "node-b"}, []string{"STOP_DIR=" + stop}, func(i int) []string {
		return []string{"--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=etcd", "--rdzv-endpoint=" + endpoint,
			"--rdzv-id=requeue-python", "--node-name=" + []string{"node-a", "node-b"}[i], "--local-addr=127.0.0.1",
			"--max-restarts=3", "--rdzv-conf=lease_ttl=2,last_call_timeout=1", script}
	})
	for _, a := range agents {
		if !a.waitOutput(90*time.Second, func(s string) bool { return strings.Contains(s, " ready") }) {
			t.Fatalf("%s: its worker never said it was ready", a.name)
		}
	}
	if err := agents[1].cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	for _, p := range agents {
		r := p.wait()
		if r.ExitCode != 75 || !strings.Contains(r.Stderr, "requeue the job to resume") {
			t.Errorf("%s: exit %d, want 75 and \"requeue the job to resume\"; stderr:\n%s", p.name, r.ExitCode, harness.Tail(r.Stderr, 30))
		}
		if n := strings.Count(r.Stdout, " ready"); n != 1 {
			t.Errorf("%s: its worker started %d times, want once (a requeue restarts nothing)", p.name, n)
		}
	}
}
