package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// stragglerWait bounds how long the test waits for gorun status to name a
// worker slowed to half speed: the goal is 20 s, measured and logged
// here (2-4 s seen); the bound only keeps a broken build from hanging.
const stragglerWait = 90 * time.Second

// TestStatusNamesTheStraggler: a 2-node job of the embedded trainer runs
// over etcd, 2 workers on node-a and 1 on node-b. Once both agents
// published their ranks' step compute, gorun status names no straggler;
// then node-b's worker is slowed to half speed (stopped and continued by
// signals, 10 ms each), and gorun status names exactly that rank.
func TestStatusNamesTheStraggler(t *testing.T) {
	srv := etcdtest.Start(t)
	endpoint := srv.Endpoints()[0]
	toml := trainerToml(t)
	// A model big enough that a step outlasts many stop/continue periods.
	sets := []string{"--set", "model.layers=2", "--set", "model.d_model=64", "--set", "model.heads=2", "--set", "model.context=64",
		"--set", "train.global_batch=12", "--set", "train.micro_batch=2", "--set", "train.steps=1000000",
		"--set", "train.log_every=1000", "--set", "optim.warmup=5", "--set", "parallel.shard_size=3"}
	var agents []*gorunProc
	for _, node := range []struct{ name, nproc string }{{"node-a", "2"}, {"node-b", "1"}} { // 3 workers on 2 cores: their CPU is contended
		args := append([]string{"--nnodes=2", "--nproc-per-node=" + node.nproc, "--rdzv-backend=etcd", "--rdzv-endpoint=" + endpoint,
			"--rdzv-id=straggler", "--node-name=" + node.name, "--local-addr=127.0.0.1", "--term-timeout=5s",
			"--rdzv-conf=lease_ttl=2,last_call_timeout=1,join_timeout=60", toml}, sets...)
		agents = append(agents, startGorun(t, node.name, nil, args...))
	}
	defer func() {
		if t.Failed() {
			for _, a := range agents {
				t.Logf("%s's log:\n%s", a.name, tail(a.stderr.String(), 30))
			}
		}
	}()
	pid, rank := awaitWorker(t, agents[1], 60*time.Second)
	awaitStats(t, srv.Client(t), 2, 60*time.Second)
	if named := stragglers(t, endpoint); len(named) > 0 {
		t.Fatalf("before any slowdown gorun status names %q", named)
	}

	stop := halfSpeed(pid)
	defer stop()
	slowed := time.Now()
	want := fmt.Sprintf("straggler: rank %d on node-b, ", rank)
	var named []string
	for named = stragglers(t, endpoint); len(named) == 0; named = stragglers(t, endpoint) {
		if time.Since(slowed) > stragglerWait {
			t.Fatalf("gorun status named no straggler %v after rank %d was slowed to half speed; the agents publish %s",
				stragglerWait, rank, publishedStats(t, endpoint))
		}
		time.Sleep(250 * time.Millisecond) // polling what the agents publish every 2 s
	}
	t.Logf("gorun status named %v, %s after rank %d was slowed", named, time.Since(slowed).Round(time.Millisecond), rank)
	if len(named) != 1 || !strings.HasPrefix(named[0], want) {
		t.Fatalf("gorun status names %q, want only %q...", named, want)
	}
}

// awaitStats polls until nodes agents published their ranks' step
// compute; it fails t after d.
func awaitStats(t *testing.T, cli *clientv3.Client, nodes int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := cli.Get(ctx, etcdstore.Incarnation{RunID: "straggler"}.Prefix()+etcdstore.PrefixStats, clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		if err == nil && resp.Count >= int64(nodes) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v, fewer than %d agents published their step compute (%v)", d, nodes, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// awaitWorker polls until agent p runs a worker and returns its pid and
// RANK; it fails t after d.
func awaitWorker(t *testing.T, p *gorunProc, d time.Duration) (pid, rank int) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if pid, rank, ok := findWorker(p); ok {
			return pid, rank
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no worker after %v", p.name, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// halfSpeed stops and continues process pid, 10 ms each, until the
// returned func is called; that func leaves the process continued.
func halfSpeed(pid int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		stopped := false
		for {
			select {
			case <-done:
				_ = syscall.Kill(pid, syscall.SIGCONT)
				return
			case <-tick.C:
				sig := syscall.SIGSTOP
				if stopped {
					sig = syscall.SIGCONT
				}
				if syscall.Kill(pid, sig) != nil {
					return // gone
				}
				stopped = !stopped
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// stragglers are the "straggler: " lines of gorun status, run without
// logging its output (it is polled).
func stragglers(t *testing.T, endpoint string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stdout, err := exec.CommandContext(ctx, gorunBin, "status", "--rdzv-endpoint="+endpoint, "--rdzv-id=straggler").Output()
	if err != nil {
		t.Fatalf("gorun status: %v", err)
	}
	var out []string
	for _, l := range strings.Split(string(stdout), "\n") {
		if strings.HasPrefix(l, "straggler: ") {
			out = append(out, l)
		}
	}
	return out
}

// publishedStats is every agent's stats key, for a failure message.
func publishedStats(t *testing.T, endpoint string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "etcdctl", "--endpoints="+endpoint, "get", "--prefix", "/gorun/straggler/").Output()
	if err != nil {
		return fmt.Sprintf("(etcdctl: %v)", err)
	}
	return string(out)
}
