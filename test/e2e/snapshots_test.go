package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/test/harness"
)

// PyTorch snapshots (issue 33) under real gorun agents: the DDP example
// examples/pytorch/snapshots.py (gloo on CPU, a 2 MB model) saves a
// snapshot every step in the agent's per-job directory, and a worker that
// gorun restarts goes on from the step the agents agreed on.

// snapSteps is how many steps the example trains: enough that a kill
// after snapKillAt lands in the middle of training.
const (
	snapSteps  = 400
	snapKillAt = 40
)

func snapshotsScript() string {
	return filepath.Join(moduleRoot, "examples", "pytorch", "snapshots.py")
}

// snapshotArgs are the example's arguments, writing its final state_dict
// to out.
func snapshotArgs(out string, extra ...string) []string {
	return append([]string{snapshotsScript(), "--model-mb", "2", "--steps", strconv.Itoa(snapSteps), "--out", out}, extra...)
}

// agreement is one of the agent's "snapshots: ..." log lines (JSON):
// what the agents agreed before a round's workers started.
type agreement struct {
	Message string `json:"message"`
	Round   int    `json:"round"`
	Restore bool   `json:"restore"`
	Step    uint64 `json:"step"`
	Newest  uint64 `json:"newest"`
	Redone  uint64 `json:"redone"`
	Reason  string `json:"reason"`
}

// agreements parses the agreement lines of an agent's stderr.
func agreements(stderr string) []agreement {
	var out []agreement
	for _, l := range strings.Split(stderr, "\n") {
		var a agreement
		if json.Unmarshal([]byte(l), &a) == nil && strings.HasPrefix(a.Message, "snapshots: ") && strings.Contains(l, `"restore"`) {
			out = append(out, a)
		}
	}
	return out
}

// requireSameModel fails unless the state_dicts torch.save wrote at ref
// and got hold the same tensors, bit for bit.
func requireSameModel(t *testing.T, ref, got string) {
	t.Helper()
	const compare = `import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
assert a.keys() == b.keys(), (sorted(a), sorted(b))
for k in a:
    x, y = a[k], b[k]
    assert x.dtype == y.dtype and x.shape == y.shape, k
    assert torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)), "tensor %s differs: max |diff| %g" % (k, (x - y).abs().max())
`
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, torch.Python, "-c", compare, ref, got).CombinedOutput()
	if err != nil {
		t.Fatalf("the final model %s is not bit-identical to the fault-free run's %s: %v\n%s", got, ref, err, out)
	}
}

// requireNoShm fails when /dev/shm holds a snapshot directory of run id.
func requireNoShm(t *testing.T, runID string) {
	t.Helper()
	left, _ := filepath.Glob(filepath.Join("/dev/shm", "gorun-"+runID+"-*"))
	if len(left) > 0 {
		t.Errorf("snapshot directories left in /dev/shm: %v", left)
		for _, d := range left {
			_ = os.RemoveAll(d)
		}
	}
}

// waitUntil waits until cond holds, or p exits (then it says whether cond
// holds by then), bounded by runTimeout.
func waitUntil(p *gorunProc, cond func() bool) bool {
	deadline := time.After(runTimeout)
	for !cond() {
		select {
		case <-p.done:
			return cond()
		case <-deadline:
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
	return true
}

// workerOf is the live worker of global rank rank among the processes p
// started.
func (p *gorunProc) workerOf(rank int) (harness.Proc, bool) {
	for _, w := range harness.Marked(markerEnv + "=" + p.marker) {
		if v, ok := w.Getenv("RANK"); ok && v == strconv.Itoa(rank) {
			return w, true
		}
	}
	return harness.Proc{}, false
}

// A worker killed with SIGKILL in the middle of training: gorun restarts
// the node's workers, the agent agrees on the step every rank holds (the
// state is replicated, so the newest any rank saved: no step redone) and
// the workers go on from it; the final model is bit-identical to a
// fault-free run's, and no snapshot directory is left in /dev/shm. The
// fault-free run has --snapshots=false, which gives the workers no
// snapshot directory (the example then trains as under torchrun).
func TestSnapshotsWorkerKill(t *testing.T) {
	torch.Require(t)
	dir := t.TempDir()
	ref, got := filepath.Join(dir, "ref.pt"), filepath.Join(dir, "got.pt")
	id := "snap-kill-" + newMarker(t)

	r := runGorun(t, ddpEnv, "--standalone", "--nproc-per-node=2", "--rdzv-id="+id+"-ref", "--snapshots=false", snapshotsScript(),
		"--model-mb", "2", "--steps", strconv.Itoa(snapSteps), "--out", ref)
	if r.ExitCode != 0 {
		t.Fatalf("fault-free run: exit %d", r.ExitCode)
	}
	if a := agreements(r.Stderr); len(a) > 0 || strings.Contains(r.Stderr, "gorun snapshots:") {
		t.Errorf("--snapshots=false: the agent agreed on snapshots or a worker saw a directory: %v", a)
	}

	p := startGorun(t, "gorun", ddpEnv, append([]string{"--standalone", "--nproc-per-node=2", "--max-restarts=1", "--rdzv-id=" + id},
		snapshotArgs(got)...)...)
	if !p.waitOutput(runTimeout, func(out string) bool { return strings.Contains(out, fmt.Sprintf("step %d loss", snapKillAt)) }) {
		p.wait()
		t.Fatalf("training never reached step %d", snapKillAt)
	}
	w, ok := p.workerOf(1)
	if !ok {
		t.Fatal("no worker of rank 1 running")
	}
	if err := syscall.Kill(w.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The restarted workers run with the agreed step in their
	// environment, from the snapshot directory's copy of the package.
	var rec agreement
	if !waitUntil(p, func() bool {
		a := agreements(p.stderr.String())
		if len(a) < 2 {
			return false
		}
		rec = a[1]
		return true
	}) {
		p.wait()
		t.Fatal("no agreement after the kill")
	}
	for rank := range 2 {
		w, ok := p.workerOf(rank)
		if !ok {
			t.Fatalf("no restarted worker of rank %d", rank)
		}
		dir, _ := w.Getenv("GORUN_SNAPSHOT_DIR")
		step, _ := w.Getenv("GORUN_SNAPSHOT_STEP")
		verified, _ := w.Getenv("GORUN_SNAPSHOT_VERIFIED")
		path, _ := w.Getenv("PYTHONPATH")
		if !strings.HasPrefix(dir, "/dev/shm/gorun-"+id+"-") || step != strconv.FormatUint(rec.Step, 10) || verified != "1" || !strings.HasPrefix(path, dir+"/python") {
			t.Errorf("rank %d restarted with GORUN_SNAPSHOT_DIR=%q GORUN_SNAPSHOT_STEP=%q GORUN_SNAPSHOT_VERIFIED=%q PYTHONPATH=%q; want the agreed step %d from a directory of the run, and its python/ first",
				rank, dir, step, verified, path, rec.Step)
		}
	}
	res := p.wait()
	if res.ExitCode != 0 {
		t.Fatalf("exit %d after the worker kill, want 0", res.ExitCode)
	}
	agreed := agreements(res.Stderr)
	if len(agreed) != 2 || agreed[0].Restore || !agreed[1].Restore {
		t.Fatalf("want two agreements, none at the start and a restore after the kill; got %+v", agreed)
	}
	rec = agreed[1]
	if rec.Step < snapKillAt || rec.Redone > 1 {
		t.Errorf("restored step %d (newest any rank had %d, %d redone): want at least step %d and at most 1 redone", rec.Step, rec.Newest, rec.Redone, snapKillAt)
	}
	if !strings.Contains(res.Stdout, fmt.Sprintf("restored step %d\n", rec.Step)) {
		t.Errorf("rank 0 did not say it restored step %d", rec.Step)
	}
	t.Logf("worker kill: restored step %d, newest any rank had %d, %d steps redone", rec.Step, rec.Newest, rec.Redone)
	requireSameModel(t, ref, got)
	requireNoShm(t, id)
	requireNoShm(t, id+"-ref")
}

// An agent killed with SIGKILL leaves no snapshot directory behind: its
// guard, which outlives it, kills its workers and then removes the
// directory.
func TestSnapshotsGoWithAKilledAgent(t *testing.T) {
	torch.Require(t)
	id := "snap-agent-kill-" + newMarker(t)
	p := startGorun(t, "gorun", ddpEnv, append([]string{"--standalone", "--nproc-per-node=1", "--rdzv-id=" + id},
		snapshotArgs(filepath.Join(t.TempDir(), "out.pt"))...)...)
	if !p.waitOutput(runTimeout, func(out string) bool { return strings.Contains(out, "step 5 loss") }) {
		p.wait()
		t.Fatal("training never reached step 5")
	}
	dirs, _ := filepath.Glob(filepath.Join("/dev/shm", "gorun-"+id+"-*"))
	if len(dirs) != 1 {
		t.Fatalf("want one snapshot directory of the run in /dev/shm, found %v", dirs)
	}
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.done
	// The guard reads the end of its input once gorun is gone; then it
	// kills the workers and removes the directory, and exits.
	gone := func() bool {
		_, err := os.Stat(dirs[0])
		return os.IsNotExist(err) && len(listMarked(p.marker)) == 0
	}
	deadline := time.After(runTimeout)
	for !gone() {
		select {
		case <-deadline:
			t.Fatalf("%s still there, or processes of the run alive (%v), after gorun was killed", dirs[0], listMarked(p.marker))
		case <-time.After(50 * time.Millisecond):
		}
	}
	requireNoShm(t, id)
}
