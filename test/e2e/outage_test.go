package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/test/harness"
)

// outageWorker records each start (one line per start, one file per
// round and rank), then runs until the test creates $OUT/release.
const outageWorker = `echo start >> "$OUT/starts-rank$RANK"; : > "$OUT/round$TORCHELASTIC_RESTART_COUNT-rank$RANK"; ` +
	`while [ ! -e "$OUT/release" ]; do sleep 0.1; done; echo "rank $RANK done"`

// waitStderr waits until every agent's stderr contains want; it fails the
// test when an agent exits first or within d.
func waitStderr(t *testing.T, agents []*gorunProc, want string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for _, a := range agents {
		for !strings.Contains(a.stderr.String(), want) {
			select {
			case <-a.done:
				t.Fatalf("%s exited (code %d) before logging %q:\n%s", a.name, a.res.ExitCode, want, harness.Tail(a.stderr.String(), 20))
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not log %q within %s:\n%s", a.name, want, d, harness.Tail(a.stderr.String(), 20))
			}
		}
	}
}

// An etcd frozen (SIGSTOP) for several lease TTLs under a healthy 3-node
// job: every agent loses contact and etcd expires every lease, yet no
// agent exits and no worker is restarted; once etcd answers again each
// agent re-establishes its session under a new lease, the members are
// back within the grace, and the job finishes in its first round.
func TestEtcdFrozenUnderAHealthyJob(t *testing.T) {
	const ttl = 2 * time.Second
	port := testutil.FreePort(t)
	etcd := startGorun(t, "etcd", nil, "rendezvous", "serve", fmt.Sprintf("--listen=127.0.0.1:%d", port),
		fmt.Sprintf("--peer-listen=127.0.0.1:%d", testutil.FreePort(t)), "--data-dir="+filepath.Join(t.TempDir(), "etcd"))
	out := t.TempDir()
	var agents []*gorunProc
	for _, name := range []string{"node-a", "node-b", "node-c"} {
		agents = append(agents, startGorun(t, name, []string{"OUT=" + out},
			"--nnodes=3", "--nproc-per-node=1", "--rdzv-backend=etcd", fmt.Sprintf("--rdzv-endpoint=127.0.0.1:%d", port),
			"--rdzv-id=frozen", "--node-name="+name, "--local-addr=127.0.0.1",
			fmt.Sprintf("--rdzv-conf=lease_ttl=%d,join_timeout=60", int(ttl.Seconds())), "--",
			"/bin/sh", "-c", outageWorker))
	}
	// Runs before the processes' own cleanups: a stopped etcd cannot
	// take its SIGTERM.
	t.Cleanup(func() { _ = etcd.cmd.Process.Signal(syscall.SIGCONT) })
	waitRound0 := func() {
		deadline := time.Now().Add(60 * time.Second)
		for {
			files, _ := filepath.Glob(filepath.Join(out, "round0-rank*"))
			if len(files) == 3 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("round 0: %d of 3 workers started", len(files))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitRound0()

	if err := etcd.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	waitStderr(t, agents, "lost contact with etcd", 30*time.Second)
	time.Sleep(2 * ttl) // the fault: etcd stays frozen well past every lease's expiry
	if err := etcd.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd frozen for %s (lease TTL %s)", time.Since(frozen).Round(time.Millisecond), ttl)
	waitStderr(t, agents, "etcd session re-established", 30*time.Second)
	waitStderr(t, agents, "etcd outage over", 30*time.Second)
	// Most leases expired in the freeze; etcd may still have held one
	// whose keep-alive it took before its revocation (etcd revokes
	// expired leases asynchronously once it runs again): kept is right
	// then. Either way the session is back and nothing restarted.
	renewed := 0
	for _, a := range agents {
		switch log := a.stderr.String(); {
		case strings.Contains(log, "expired: a new lease"):
			renewed++
		case !strings.Contains(log, `"lease":"kept"`):
			t.Errorf("%s: its session was neither kept nor renewed:\n%s", a.name, harness.Tail(log, 20))
		}
	}
	t.Logf("%d of 3 leases expired in the freeze and were renewed", renewed)

	if err := os.WriteFile(filepath.Join(out, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		if r := a.wait(); r.ExitCode != 0 {
			t.Errorf("%s: exit %d, want 0: the outage must not end the job", a.name, r.ExitCode)
		}
	}
	if later, _ := filepath.Glob(filepath.Join(out, "round[1-9]*")); len(later) > 0 {
		t.Errorf("a round after the first started: %v", later)
	}
	for rank := range 3 {
		data, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("starts-rank%d", rank)))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(data), "start"); n != 1 {
			t.Errorf("rank %d started %d times, want once", rank, n)
		}
	}
	status := runGorun(t, nil, "status", fmt.Sprintf("--rdzv-endpoint=127.0.0.1:%d", port), "--rdzv-id=frozen")
	if !strings.Contains(status.Stdout, "succeeded") {
		t.Errorf("gorun status:\n%s", status.Stdout)
	}
}
