package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// appendWorker appends one line per worker run to $OUT/runs.
const appendWorker = `echo "$TORCHELASTIC_RUN_ID $RANK $TORCHELASTIC_RESTART_COUNT" >> "$OUT/runs"`

// runLines returns the lines of $OUT/runs.
func runLines(t *testing.T, out string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(out, "runs"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return nonEmptyLines(string(data))
}

// startNodes starts one gorun agent per name with args, workers running
// worker with $OUT set to out.
func startNodes(t *testing.T, out, worker string, names []string, args ...string) []*gorunProc {
	t.Helper()
	return startAgents(t, names, []string{"OUT=" + out}, func(i int) []string {
		return append(append([]string{"--node-name=" + names[i], "--local-addr=127.0.0.1"}, args...), "--", "/bin/sh", "-c", worker)
	})
}

// A job run twice on one etcd runs twice: the same command with no run id
// (one node: a fresh run id each time), then the same --rdzv-id on two
// nodes, whose second run is incarnation 1 of the run. Before, the second
// run found the first one's closed state and exited 0 having run nothing.
func TestRerunOnOneEtcd(t *testing.T) {
	endpoint := etcdtest.Start(t).Endpoints()[0]
	out := t.TempDir()
	oneNode := []string{"--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=etcd", "--rdzv-endpoint=" + endpoint, "--rdzv-conf=lease_ttl=2"}
	for i := range 2 {
		r := startNodes(t, out, appendWorker, []string{"solo"}, oneNode...)[0].wait()
		if r.ExitCode != 0 || !strings.Contains(r.Stderr, `"run_id":"gorun-`) || !strings.Contains(r.Stderr, ": joining incarnation 0") {
			t.Fatalf("one-node run %d: exit %d, want 0 with a fresh run id in incarnation 0:\n%s", i, r.ExitCode, r.Stderr)
		}
	}
	if lines := runLines(t, out); len(lines) != 4 || strings.Fields(lines[0])[0] == strings.Fields(lines[3])[0] {
		t.Fatalf("two one-node runs: want 4 worker runs under two run ids, got %q", lines)
	}

	twoNodes := []string{"--nnodes=2", "--nproc-per-node=2", "--rdzv-endpoint=" + endpoint, "--rdzv-id=again", "--rdzv-conf=lease_ttl=2"}
	for run := range 2 {
		started := 0
		for _, a := range startNodes(t, out, appendWorker, []string{"node-a", "node-b"}, twoNodes...) {
			r := a.wait()
			if r.ExitCode != 0 {
				t.Fatalf("run %d, %s: exit %d, want 0", run, a.name, r.ExitCode)
			}
			if strings.Contains(r.Stderr, "run again finished before (incarnation 0, succeeded): starting incarnation 1") {
				started++
			}
		}
		if want := run; started != want {
			t.Errorf("run %d: %d agents said they started incarnation 1, want %d", run, started, want)
		}
		if lines := runLines(t, out); len(lines) != 4+4*(run+1) {
			t.Fatalf("after run %d of --rdzv-id=again: %d worker runs, want %d: %q", run, len(lines), 4+4*(run+1), lines)
		}
	}
	status := runGorun(t, nil, "status", "--rdzv-endpoint="+endpoint, "--rdzv-id=again")
	for _, want := range []string{"run again incarnation 1: round 0 closed", "result: succeeded"} {
		if status.ExitCode != 0 || !strings.Contains(status.Stdout, want) {
			t.Errorf("gorun status of the finished run: exit %d, lacks %q:\n%s", status.ExitCode, want, status.Stdout)
		}
	}
}

// A run whose agents were all killed (kill -9) is dead once their leases
// expire: the same run id launched again runs as incarnation 1, from round
// 0 with fresh restart and membership-change counters, as a SLURM requeue
// on an external etcd does.
func TestRunAfterDeadRun(t *testing.T) {
	srv := etcdtest.Start(t)
	endpoint := srv.Endpoints()[0]
	out := t.TempDir()
	args := []string{"--nnodes=2", "--nproc-per-node=1", "--rdzv-endpoint=" + endpoint, "--rdzv-id=requeue", "--rdzv-conf=lease_ttl=2"}
	waiter := `echo started > "$OUT/started-$RANK"; exec sleep 300`
	first := startNodes(t, out, waiter, []string{"node-a", "node-b"}, args...)
	for _, rank := range []string{"0", "1"} {
		waitFile(t, filepath.Join(out, "started-"+rank), 60*time.Second)
	}
	for _, a := range first {
		if err := a.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range first {
		if r := a.wait(); r.ExitCode != -1 {
			t.Errorf("%s: exit %d after kill -9", a.name, r.ExitCode)
		}
	}
	awaitNoNodes(t, srv.Client(t), etcdstore.Incarnation{RunID: "requeue"}, 30*time.Second)

	second := startNodes(t, out, appendWorker, []string{"node-a", "node-b"}, args...)
	started := 0
	for _, a := range second {
		r := a.wait()
		if r.ExitCode != 0 {
			t.Errorf("%s: exit %d, want 0", a.name, r.ExitCode)
		}
		if strings.Contains(r.Stderr, "run requeue died before (incarnation 0: round 0 running, no agent alive): starting incarnation 1") {
			started++
		}
	}
	if started != 1 {
		t.Errorf("%d agents said they started incarnation 1, want 1", started)
	}
	lines := runLines(t, out)
	if len(lines) != 2 {
		t.Fatalf("incarnation 1: %d worker runs, want 2: %q", len(lines), lines)
	}
	for _, l := range lines {
		if !strings.HasSuffix(l, " 0") {
			t.Errorf("worker of incarnation 1: %q, want TORCHELASTIC_RESTART_COUNT 0", l)
		}
	}
	status := runGorun(t, nil, "status", "--rdzv-endpoint="+endpoint, "--rdzv-id=requeue")
	for _, want := range []string{"run requeue incarnation 1: round 0 closed", "restarts used: 0 of 0 after worker failures, 0 of 10 after membership changes"} {
		if !strings.Contains(status.Stdout, want) {
			t.Errorf("gorun status lacks %q:\n%s", want, status.Stdout)
		}
	}
}

// Nodes that meet over etcd outside SLURM need a run id that they share:
// without one gorun refuses at once.
func TestMultiNodeNeedsRunID(t *testing.T) {
	r := runGorun(t, nil, "--nnodes=2:3", "--rdzv-endpoint=127.0.0.1:1", "--", "true")
	if r.ExitCode != 2 || !strings.Contains(r.Stderr, "give every node the same --rdzv-id") {
		t.Errorf("exit %d, want 2 and a message that asks for --rdzv-id:\n%s", r.ExitCode, r.Stderr)
	}
}

// waitFile waits until path exists.
func waitFile(t *testing.T, path string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear within %s", path, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// awaitNoNodes waits until no agent is registered in incarnation in: the
// killed agents' leases expired.
func awaitNoNodes(t *testing.T, client *clientv3.Client, in etcdstore.Incarnation, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	prefix := in.Prefix() + rendezvous.PrefixNodes
	for {
		resp, err := client.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatalf("agents of %s still registered after %s: %v", in.Prefix(), within, err)
		}
		if resp.Count == 0 {
			return
		}
		watch := client.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1), clientv3.WithFilterPut())
		select {
		case <-watch:
		case <-ctx.Done():
		}
	}
}
