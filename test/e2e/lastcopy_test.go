package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gorun/gorun/test/harness"
)

// stoppedAndRunAgain: a job with --snapshot-durable stopped by SIGTERM (as
// scancel or SLURM's time limit stop it) in the middle of training, with no
// step due for a durable copy, and then run again: its agent copied its
// ranks' last snapshots to the durable directory as it ended, so the second
// run restores the step the first had reached (at most the step in flight
// redone) instead of starting over, and its final model is bit-identical
// to the fault-free run's (ref).
func stoppedAndRunAgain(t *testing.T, ref string) {
	dir := t.TempDir()
	dst, got := filepath.Join(dir, "durable"), filepath.Join(dir, "got.pt")
	id := "snap-stop-" + newMarker(t)
	flags := []string{"--standalone", "--nproc-per-node=2", "--rdzv-id=" + id,
		"--snapshot-durable=" + dst, "--snapshot-durable-every=100000"}
	p := startGorun(t, "gorun", ddpEnv, append(flags, snapshotArgs(got)...)...)
	if !p.waitOutput(runTimeout, func(out string) bool { return strings.Contains(out, fmt.Sprintf("step %d loss", snapKillAt)) }) {
		p.wait()
		t.Fatalf("training never reached step %d", snapKillAt)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	first := p.wait()
	if first.ExitCode != 128+int(syscall.SIGTERM) {
		t.Fatalf("stopped by SIGTERM: exit %d, want %d\n%s", first.ExitCode, 128+int(syscall.SIGTERM), first.Stderr)
	}
	reached := harness.LastStep(first.Stdout)
	if reached < snapKillAt || reached >= snapSteps {
		t.Fatalf("the first run said step %d last; want one in %d..%d", reached, snapKillAt, snapSteps-1)
	}
	if !strings.Contains(first.Stderr, "gorun: snapshots: this node's newest is step ") {
		t.Errorf("the stopped run did not say where its last snapshots went:\n%s", first.Stderr)
	}
	requireNoShm(t, id)

	again := runGorun(t, ddpEnv, append(flags, snapshotArgs(got)...)...)
	if again.ExitCode != 0 {
		t.Fatalf("run again: exit %d\n%s", again.ExitCode, again.Stderr)
	}
	a := agreements(again.Stderr)
	if len(a) == 0 || !a[0].Restore || !strings.Contains(a[0].Message, "from the durable directory") || int(a[0].Step) < reached-1 {
		t.Fatalf("run again: agreements %+v; want the first to restore from the durable directory step %d or %d (the first run's last, or the one before it when its save was cut short)",
			a, reached, reached-1)
	}
	if !strings.Contains(again.Stdout, fmt.Sprintf("restored step %d\n", a[0].Step)) {
		t.Errorf("rank 0 did not say it restored step %d", a[0].Step)
	}
	t.Logf("stopped at step %d; the run again restored step %d from the durable directory", reached, a[0].Step)
	requireSameModel(t, ref, got)
	requireNoShm(t, id)
}
