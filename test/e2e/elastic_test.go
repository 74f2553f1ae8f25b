package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/internal/testutil"
)

// roundWorker records what a worker was told, one file per (round, rank)
// written whole (rename), then sleeps until it is stopped.
const roundWorker = `f="$OUT/round$TORCHELASTIC_RESTART_COUNT-rank$RANK"; echo "$RANK $WORLD_SIZE $TORCHELASTIC_RESTART_COUNT $MASTER_ADDR:$MASTER_PORT $GROUP_RANK" > "$f.tmp" && mv "$f.tmp" "$f"; exec sleep 300`

// elasticAgent starts one agent of job runID as node name.
func elasticAgent(t *testing.T, endpoint, runID, name, out string, extra ...string) *gorunProc {
	t.Helper()
	args := append([]string{
		"--nnodes=2:3", "--nproc-per-node=2", "--rdzv-backend=etcd", "--rdzv-endpoint=" + endpoint,
		"--rdzv-id=" + runID, "--node-name=" + name, "--local-addr=127.0.0.1", "--term-timeout=5s",
		"--rdzv-conf=lease_ttl=2,last_call_timeout=10,join_timeout=60",
	}, extra...)
	args = append(args, "--", "/bin/sh", "-c", roundWorker)
	return startGorun(t, name, []string{"OUT=" + out}, args...)
}

// waitRound waits until every worker of round n wrote its file and checks
// the round: world size, ranks 0..world-1 once each, one master.
func waitRound(t *testing.T, dir string, n, world int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var files []string
	for {
		files, _ = filepath.Glob(filepath.Join(dir, fmt.Sprintf("round%d-rank[0-9]", n)))
		if len(files) >= world || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(files) != world {
		t.Fatalf("round %d: %d workers started, want %d", n, len(files), world)
	}
	masters, ranks := map[string]bool{}, map[string]bool{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var rank, size, restart, group int
		var master string
		if _, err := fmt.Sscanf(strings.TrimSpace(string(data)), "%d %d %d %s %d", &rank, &size, &restart, &master, &group); err != nil {
			t.Fatalf("%s: %q: %v", f, data, err)
		}
		if size != world || restart != n {
			t.Errorf("%s: WORLD_SIZE=%d TORCHELASTIC_RESTART_COUNT=%d, want %d and %d", f, size, restart, world, n)
		}
		masters[master], ranks[fmt.Sprint(rank)] = true, true
	}
	if len(masters) != 1 || len(ranks) != world {
		t.Errorf("round %d: masters %v, ranks %v", n, keysOf(masters), keysOf(ranks))
	}
}

func keysOf(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Three agents form one round of 6 workers; kill -9 of one agent (and so
// its workers) makes the other two restart with 4 within the lease TTL and
// a bit; a new agent scales the job back to 6. The long last call keeps a
// slow-starting third agent in the first round; later rounds do not wait
// for it (they freeze once every live node joined).
func TestElasticNodeLossAndScaleUp(t *testing.T) {
	endpoint := etcdtest.Start(t).Endpoints()[0]
	out := t.TempDir()
	agents := []*gorunProc{
		elasticAgent(t, endpoint, "elastic", "node-a", out),
		elasticAgent(t, endpoint, "elastic", "node-b", out),
		elasticAgent(t, endpoint, "elastic", "node-c", out),
	}
	waitRound(t, out, 0, 6, 60*time.Second)

	killed := time.Now()
	if err := agents[2].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitRound(t, out, 1, 4, 30*time.Second)
	t.Logf("kill -9 of an agent to all 4 workers of the next round started: %s (lease TTL 2s)", time.Since(killed).Round(time.Millisecond))
	if r := agents[2].wait(); r.ExitCode != -1 {
		t.Errorf("killed agent: exit %d", r.ExitCode)
	}

	agents = append(agents, elasticAgent(t, endpoint, "elastic", "node-d", out))
	waitRound(t, out, 2, 6, 30*time.Second)

	status := runGorun(t, nil, "status", "--rdzv-endpoint="+endpoint, "--rdzv-id=elastic")
	for _, want := range []string{"run elastic incarnation 0: round 2 running", "2 of 10 after membership changes", "node-a", "node-b", "node-d", "reason: node node-d waiting to join"} {
		if !strings.Contains(status.Stdout, want) {
			t.Errorf("gorun status lacks %q:\n%s", want, status.Stdout)
		}
	}
	if strings.Contains(status.Stdout, "node-c  127.0.0.1") || !strings.Contains(status.Stdout, "node node-c lost at") {
		t.Errorf("gorun status shows the dead node-c as a member, or not as the lost node:\n%s", status.Stdout)
	}

	for _, a := range []*gorunProc{agents[0], agents[1], agents[3]} {
		a.cancel() // SIGTERM
	}
	for _, a := range []*gorunProc{agents[0], agents[1], agents[3]} {
		if r := a.wait(); r.ExitCode != 143 {
			t.Errorf("%s: exit %d after SIGTERM, want 143", a.name, r.ExitCode)
		}
	}
}

// A worker failure on one node stops every node's workers and, with the
// budget spent, every agent exits with the first failure's code and names it.
func TestElasticFailureReachesEveryNode(t *testing.T) {
	endpoint := etcdtest.Start(t).Endpoints()[0]
	worker := `if [ "$RANK" = 3 ]; then sleep 0.5; echo "ValueError: rank 3 gave up" >&2; exit 7; fi; exec sleep 300`
	var agents []*gorunProc
	for _, name := range []string{"node-a", "node-b"} {
		agents = append(agents, startGorun(t, name, nil,
			"--nnodes=2", "--nproc-per-node=2", "--rdzv-endpoint="+endpoint, "--rdzv-id=fail",
			"--node-name="+name, "--local-addr=127.0.0.1", "--rdzv-conf=lease_ttl=2", "--",
			"/bin/sh", "-c", worker))
	}
	for _, a := range agents {
		r := a.wait()
		if r.ExitCode != 7 {
			t.Errorf("%s: exit %d, want the first failure's 7", a.name, r.ExitCode)
		}
		if !strings.Contains(r.Stderr, "first failure: rank 3 on node-") || !strings.Contains(r.Stderr, "ValueError: rank 3 gave up") {
			t.Errorf("%s: stderr does not name the first failure:\n%s", a.name, r.Stderr)
		}
	}
}

// Restarts after a worker failure: the budget is the job's, and the
// restarted round has TORCHELASTIC_RESTART_COUNT 1.
func TestElasticRestartAfterFailure(t *testing.T) {
	endpoint := etcdtest.Start(t).Endpoints()[0]
	worker := `if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 0 ]; then exit 3; fi; [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && exec sleep 300; echo "done $RANK of $WORLD_SIZE"`
	var agents []*gorunProc
	for _, name := range []string{"node-a", "node-b"} {
		agents = append(agents, startGorun(t, name, nil,
			"--nnodes=2", "--nproc-per-node=2", "--max-restarts=1", "--rdzv-endpoint="+endpoint, "--rdzv-id=restart",
			"--node-name="+name, "--local-addr=127.0.0.1", "--rdzv-conf=lease_ttl=2", "--",
			"/bin/sh", "-c", worker))
	}
	for _, a := range agents {
		if r := a.wait(); r.ExitCode != 0 {
			t.Errorf("%s: exit %d, want 0 after one restart", a.name, r.ExitCode)
		}
	}
}

func TestElasticBelowMinNodes(t *testing.T) {
	endpoint := etcdtest.Start(t).Endpoints()[0]
	r := runGorun(t, nil, "--nnodes=2:3", "--nproc-per-node=1", "--rdzv-endpoint="+endpoint, "--rdzv-id=alone",
		"--node-name=lonely", "--local-addr=127.0.0.1", "--rdzv-conf=join_timeout=2,lease_ttl=2", "--", "true")
	if r.ExitCode == 0 || !strings.Contains(r.Stderr, "did not form within join_timeout=2s: 1 of at least 2 nodes joined (lonely)") {
		t.Errorf("exit %d, stderr:\n%s", r.ExitCode, r.Stderr)
	}
}

func TestElasticEtcdUnreachable(t *testing.T) {
	port := testutil.FreePort(t)
	r := runGorun(t, nil, "--nnodes=2", "--nproc-per-node=1", fmt.Sprintf("--rdzv-endpoint=127.0.0.1:%d", port),
		"--rdzv-id=nobody", "--rdzv-conf=connect_timeout=2", "--", "true")
	if r.ExitCode == 0 || !strings.Contains(r.Stderr, "no etcd answered") {
		t.Errorf("exit %d, stderr:\n%s", r.ExitCode, r.Stderr)
	}
}

// The unchanged DDP script trains across three agents; after kill -9 of
// one of them the other two restart it at world size 2 and finish, with
// identical parameters on both ranks.
func TestDDPElasticRestartAfterNodeLoss(t *testing.T) {
	torch.Require(t)
	endpoint := etcdtest.Start(t).Endpoints()[0]
	out := t.TempDir()
	var agents []*gorunProc
	for _, name := range []string{"node-a", "node-b", "node-c"} {
		agents = append(agents, startGorun(t, name, ddpEnv,
			"--nnodes=2:3", "--nproc-per-node=1", "--max-restarts=3", "--rdzv-endpoint="+endpoint, "--rdzv-id=ddp",
			"--node-name="+name, "--local-addr=127.0.0.1", "--rdzv-conf=lease_ttl=2,last_call_timeout=10",
			trainScript(), "--steps", "60", "--step-sleep", "0.1", "--out", out))
	}
	// Rank 0 logs the steps, and any of the three may be rank 0.
	reached := func() bool {
		for _, a := range agents {
			if s := a.stdout.String(); strings.Contains(s, "step 10 loss") && strings.Contains(s, "world_size 3") {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(90 * time.Second)
	for !reached() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !reached() {
		for _, a := range agents {
			a.cancel()
			a.wait()
		}
		t.Fatal("the 3-node round never reached step 10")
	}
	if err := agents[2].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	agents[2].wait()
	for _, a := range agents[:2] {
		if r := a.wait(); r.ExitCode != 0 {
			t.Errorf("%s: exit %d, want 0 after the restart at world size 2", a.name, r.ExitCode)
		}
	}
	if t.Failed() {
		return
	}
	checkReplicasSteps(t, out, 2, 60)
	if !strings.Contains(agents[0].stdout.String()+agents[1].stdout.String(), "done: 60 steps, world_size 2") {
		t.Error("no rank reported finishing at world size 2")
	}
}

// slurmStepEnv is what srun gives node id of a 3-node step whose nodes are
// the loopback addresses 127.0.0.1-3 (names that resolve to distinct
// addresses on any machine, as the nodes of a real cluster do).
func slurmStepEnv(jobID string, id int) []string {
	return []string{
		"SLURM_JOB_ID=" + jobID, "SLURM_STEP_ID=0", "SLURM_JOB_NODELIST=127.0.0.[1-3]",
		"SLURM_STEP_NODELIST=127.0.0.[1-3]", "SLURM_STEP_NUM_NODES=3", "SLURM_NNODES=3",
		fmt.Sprintf("SLURM_NODEID=%d", id), fmt.Sprintf("SLURM_PROCID=%d", id), "SLURM_LOCALID=0",
		"SLURM_STEP_TASKS_PER_NODE=1(x3)", "SLURM_STEP_NUM_TASKS=3",
		fmt.Sprintf("SLURMD_NODENAME=127.0.0.%d", id+1),
	}
}

// Under SLURM with no --rdzv-endpoint the step's first three nodes run a
// three-member embedded etcd; killing the node that hosts the first member
// (and is node rank 0, the master) leaves the job running on the other two.
func TestEmbeddedEtcdSurvivesHostLoss(t *testing.T) {
	jobID := fmt.Sprint(900000 + time.Now().UnixNano()%99991)
	out := t.TempDir()
	var agents []*gorunProc
	for id := range 3 {
		env := append(slurmStepEnv(jobID, id), "OUT="+out)
		agents = append(agents, startGorun(t, fmt.Sprintf("node%d", id+1), env,
			"--nnodes=2:3", "--nproc-per-node=2", "--term-timeout=5s",
			// A lease must outlive an etcd leader election (the killed
			// node may host the leader): the production TTL, 5 s.
			"--rdzv-conf=lease_ttl=5,last_call_timeout=10,join_timeout=60",
			"--", "/bin/sh", "-c", roundWorker))
	}
	waitRound(t, out, 0, 6, 90*time.Second)
	if err := agents[0].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	agents[0].wait()
	waitRound(t, out, 1, 4, 60*time.Second)
	for _, a := range agents[1:] {
		a.cancel()
		if r := a.wait(); r.ExitCode != 143 {
			t.Errorf("%s: exit %d after SIGTERM, want 143", a.name, r.ExitCode)
		}
	}
}
