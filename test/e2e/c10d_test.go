package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/test/harness"
)

// c10dAddrs are the --local-addr of the three agents of the c10d tests,
// each its own loopback address (Linux answers on all of 127.0.0.0/8):
// the first owns the endpoint and so hosts the rendezvous's etcd.
var c10dAddrs = []string{"127.0.0.21", "127.0.0.22", "127.0.0.23"}

// freePortPair returns a port p on host such that p and p+1 were both
// free a moment ago: a c10d endpoint's etcd serves clients at p and
// listens for peers at p+1.
func freePortPair(t *testing.T, host string) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatalf("finding a free port on %s: %v", host, err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		next, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p+1)))
		l.Close()
		if err == nil {
			next.Close()
			return p
		}
	}
	t.Fatalf("no two consecutive free ports on %s in 50 tries", host)
	return 0
}

// workerOn returns the pid and RANK of one worker of agent p.
func workerOn(t *testing.T, p *gorunProc) (pid, rank int) {
	t.Helper()
	pid, rank, ok := findWorker(p)
	if !ok {
		t.Fatalf("%s: no worker found", p.name)
	}
	return pid, rank
}

// findWorker returns the pid and RANK of one worker of agent p, if it
// has one running.
func findWorker(p *gorunProc) (pid, rank int, ok bool) {
	for _, w := range harness.Marked(markerEnv + "=" + p.marker) {
		if w.PPID != p.cmd.Process.Pid {
			continue // not a child of the agent (its guard, say)
		}
		if v, ok := w.Getenv("RANK"); ok {
			rank, _ = strconv.Atoi(v)
			return w.PID, rank, true
		}
	}
	return 0, 0, false
}

// torchrun's recipe with gorun in its place: --rdzv-backend=c10d at the
// first node's address runs gorun's elastic rendezvous, over an etcd that
// the first agent embeds at the endpoint. A worker killed with -9 on the
// second node ends the job on every node (--max-restarts=0): each agent
// exits with its code, 137, and names it as the first failure, not the
// workers it stopped itself.
func TestC10dEndpointGetsTheControlPlane(t *testing.T) {
	endpoint := net.JoinHostPort(c10dAddrs[0], strconv.Itoa(freePortPair(t, c10dAddrs[0])))
	out := t.TempDir()
	var agents []*gorunProc
	for i, name := range []string{"node-a", "node-b", "node-c"} {
		agents = append(agents, startGorun(t, name, []string{"OUT=" + out},
			"--nnodes=3", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint="+endpoint,
			"--rdzv-id=c10d-recipe", "--node-name="+name, "--local-addr="+c10dAddrs[i], "--max-restarts=0",
			"--term-timeout=5s", "--rdzv-conf=lease_ttl=2,join_timeout=60",
			"--", "/bin/sh", "-c", roundWorker))
	}
	waitRound(t, out, 0, 6, 60*time.Second)
	pid, rank := workerOn(t, agents[1])
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("first failure: rank %d on node-b (node ", rank)
	for _, a := range agents {
		r := waitExit(t, a, 60*time.Second)
		if r.ExitCode != 137 || !strings.Contains(r.Stderr, want) || !strings.Contains(r.Stderr, "SIGKILL") {
			t.Errorf("%s: exit %d, want 137 and %q (SIGKILL):\n%s", a.name, r.ExitCode, want, harness.Tail(r.Stderr, 15))
		}
	}
	if !strings.Contains(agents[0].stderr.String(), "hosting an embedded etcd member") {
		t.Errorf("node-a, whose --local-addr is the endpoint's, did not host the etcd")
	}
	for _, a := range agents[1:] {
		if strings.Contains(a.stderr.String(), "hosting an embedded etcd member") {
			t.Errorf("%s hosted an etcd member too", a.name)
		}
	}
}

// gorun plan of the recipe in torchrun's spelling shows the etcd
// rendezvous at the endpoint and whether this node hosts it.
func TestC10dPlanShowsTheHost(t *testing.T) {
	endpoint := c10dAddrs[0] + ":29500"
	for i, wantHost := range []bool{true, false} {
		r := runGorun(t, nil, "plan", "--nnodes", "3", "--nproc_per_node", "1", "--rdzv_id", "recipe",
			"--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--local_addr", c10dAddrs[i], "--", "true")
		var plan struct {
			Rendezvous struct {
				Backend   string          `json:"backend"`
				Endpoints []string        `json:"endpoints"`
				Member    json.RawMessage `json:"member"`
				Hosting   string          `json:"hosting"`
			} `json:"rendezvous"`
		}
		if err := json.Unmarshal([]byte(r.Stdout), &plan); err != nil {
			t.Fatalf("gorun plan: exit %d, not JSON (%v):\n%s%s", r.ExitCode, err, r.Stdout, r.Stderr)
		}
		rz := plan.Rendezvous
		if rz.Backend != "etcd" || len(rz.Endpoints) != 1 || rz.Endpoints[0] != endpoint ||
			(rz.Member != nil) != wantHost || !strings.Contains(rz.Hosting, "embedded etcd at the c10d endpoint "+endpoint) {
			t.Errorf("--local-addr %s: plan's rendezvous is %+v (member %s), want etcd at %s, hosted here: %v",
				c10dAddrs[i], rz, rz.Member, endpoint, wantHost)
		}
	}
}
