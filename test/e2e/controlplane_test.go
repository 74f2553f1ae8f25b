package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/test/harness"
)

// waitExit waits for p to exit within d (the join timeout of these jobs is
// far longer: an agent left waiting fails the test instead of hanging it).
func waitExit(t *testing.T, p *gorunProc, d time.Duration) result {
	t.Helper()
	done := make(chan result, 1)
	go func() { done <- p.wait() }()
	select {
	case r := <-done:
		return r
	case <-time.After(d):
		t.Fatalf("%s still running %s after the failure: it was left waiting", p.name, d)
		return result{}
	}
}

// An agent that fails after joining (node rank 0 cannot resolve the
// address it announces, so it cannot pick MASTER_PORT) ends the job on
// every node at once: the other agent does not wait out join_timeout, and
// both name the failed agent.
func TestAgentFailureEndsTheJob(t *testing.T) {
	srv := etcdtest.Start(t)
	endpoint := srv.Endpoints()[0]
	common := []string{"--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=etcd", "--rdzv-endpoint=" + endpoint,
		"--rdzv-id=agent-fails", "--rdzv-conf=lease_ttl=2,join_timeout=600", "--term-timeout=5s"}
	// The healthy agent joins first: the broken one may fail, and close the
	// run's incarnation 0, before a later agent reached it (that agent would
	// then wait in incarnation 1, a job of its own).
	healthy := startGorun(t, "node-b", nil, append(common, "--node-name=node-b", "--node-rank=1",
		"--local-addr=127.0.0.1", "--", "/bin/sh", "-c", "exec sleep 300")...)
	awaitKeys(t, srv.Client(t), "agent-fails", rendezvous.PrefixNodes, 1, 60*time.Second, "agents registered")
	broken := startGorun(t, "node-a", nil, append(common, "--node-name=node-a", "--node-rank=0",
		"--local-addr=no-such-host.invalid", "--", "/bin/sh", "-c", "exec sleep 300")...)
	for _, p := range []*gorunProc{broken, healthy} {
		r := waitExit(t, p, 60*time.Second)
		if r.ExitCode != 1 || !strings.Contains(r.Stderr, "the agent on node-a failed") || !strings.Contains(r.Stderr, "no-such-host.invalid") {
			t.Errorf("%s: exit %d, want 1 and a report naming the failed agent on node-a:\n%s", p.name, r.ExitCode, harness.Tail(r.Stderr, 15))
		}
	}
	st := runGorun(t, nil, "status", "--rdzv-endpoint="+endpoint, "--rdzv-id=agent-fails").Stdout
	if !strings.Contains(st, "the agent on node-a failed") {
		t.Errorf("gorun status does not name the failed agent:\n%s", st)
	}
}

// A worker that writes a 4 MiB error file and exits 1: the report is cut
// to a size etcd takes, with a note and the file's path, and every agent
// ends the job naming it (none hangs, none fails on its own).
func TestHugeErrorFileIsReportedCut(t *testing.T) {
	endpoint := etcdtest.Start(t).Endpoints()[0]
	worker := `if [ "$RANK" = 2 ]; then
  { printf '{"message": "RuntimeError: big'; head -c 4194304 /dev/zero | tr '\0' 'x'; printf '"}'; } > "$TORCHELASTIC_ERROR_FILE"
  exit 1
fi
exec sleep 300`
	var agents []*gorunProc
	for i, name := range []string{"node-a", "node-b"} {
		agents = append(agents, startGorun(t, name, nil, "--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=etcd",
			"--rdzv-endpoint="+endpoint, "--rdzv-id=huge-error", "--rdzv-conf=lease_ttl=2,join_timeout=600",
			"--node-name="+name, "--node-rank="+string(rune('0'+i)), "--local-addr=127.0.0.1", "--max-restarts=0",
			"--term-timeout=5s", "--", "/bin/sh", "-c", worker))
	}
	for _, p := range agents {
		r := waitExit(t, p, 60*time.Second)
		if r.ExitCode != 1 || !strings.Contains(r.Stderr, "first failure: rank 2 on node-b") {
			t.Errorf("%s: exit %d, want 1 naming rank 2 on node-b first:\n%s", p.name, r.ExitCode, harness.Tail(r.Stderr, 15))
		}
		if len(r.Stderr) > 64<<10 {
			t.Errorf("%s: %d bytes on the console: the error was not cut", p.name, len(r.Stderr))
		}
	}
	st := runGorun(t, nil, "status", "--json", "--rdzv-endpoint="+endpoint, "--rdzv-id=huge-error").Stdout
	if !strings.Contains(st, "[cut: first ") || !strings.Contains(st, "error.json") {
		t.Errorf("gorun status --json: the report is not cut with a note naming the file:\n%s", harness.Tail(st, 20))
	}
}
