package elastic

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/internal/workerlog"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// channelWorker is a shell worker that speaks the heartbeat channel as
// the embedded trainer does: it prints "started as <rank>", appends its
// pid to pids.<agent>.<local rank> (a restart adds a line), reports step 1, and then appends every
// round or next line it gets to rounds.<agent>.<local rank> and to its stdout and
// reports the next step, until its channel closes. As a hot spare
// (GORUN_STANDBY=1) it prints "standby" and says it is ready instead of
// reporting a step, until its first round.
const channelWorker = `step=1
if [ "$GORUN_STANDBY" = 1 ]; then
  echo standby
  step=0
else
  echo "started as $RANK"
fi
echo $$ >> "$DIR/pids.$AGENT.$LOCAL_RANK"
if [ $step = 0 ]; then echo ready >&3; else echo $step >&3; fi
while read -r line <&3; do
  case "$line" in round*|next*)
    echo "$line"
    echo "$line" >> "$DIR/rounds.$AGENT.$LOCAL_RANK"
    step=$((step+1))
    echo $step >&3;;
  esac
done`

const inPlaceTTL = 2 * time.Second

// etcdAgent is one node of a job over real etcd: an agent whose etcd
// client the test can close, as a dead node's goes silent.
type etcdAgent struct {
	name    string
	client  *clientv3.Client
	agent   *Agent
	signals chan os.Signal
	report  *testutil.SyncBuffer
	console *testutil.SyncBuffer // its workers' output
	cancel  context.CancelFunc
	done    chan Outcome
}

// startEtcdAgent starts agent name (2 workers of channelWorker) of job
// runID on eps; lastCall is the rendezvous's last call.
func startEtcdAgent(t *testing.T, eps []string, runID, name, dir string, lastCall time.Duration) *etcdAgent {
	t.Helper()
	return startEtcdAgentOf(t, eps, runID, name, dir, lastCall, channelWorker)
}

// startEtcdAgentOf is startEtcdAgent with workers of the shell script
// worker.
func startEtcdAgentOf(t *testing.T, eps []string, runID, name, dir string, lastCall time.Duration, worker string) *etcdAgent {
	t.Helper()
	client := etcdtest.NewClient(t, eps...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	entry, err := etcdstore.NewConn(client).Enter(ctx, runID, etcdstore.Launch{})
	require.NoError(t, err)
	store, err := etcdstore.NewConn(client).NewStore(ctx, entry.Incarnation, inPlaceTTL)
	require.NoError(t, err)
	rdzv, err := rendezvous.Join(ctx, store, rendezvous.Config{
		Self:     rendezvous.Member{ID: name + "-id", Host: name, Addr: "127.0.0.1", Preferred: -1, NProc: 2},
		Limits:   rendezvous.Limits{MinNodes: 2, MaxNodes: 3, MaxFailures: 3, MaxChanges: 3},
		LastCall: lastCall, JoinTimeout: 30 * time.Second, LeaseTTL: inPlaceTTL,
		FreePort: func(string) (int, error) { return 29500, nil }, Log: zerolog.Nop(),
	})
	require.NoError(t, err)
	out := &testutil.SyncBuffer{}
	n := &etcdAgent{name: name, client: client, signals: make(chan os.Signal, 4), report: &testutil.SyncBuffer{}, console: out, cancel: cancel, done: make(chan Outcome, 1)}
	n.agent, err = New(Spec{
		RunID: runID, Host: name, LocalWorkers: 2, Role: "default",
		Command: []string{"sh", "-c", worker}, Environ: append(os.Environ(), "DIR="+dir, "AGENT="+name),
		TermTimeout: 5 * time.Second, ErrorDir: t.TempDir(), Report: n.report, Signals: n.signals,
		Logs:    workerlog.Config{Stdout: out, Stderr: out, TailLines: 20},
		InPlace: true,
		Log:     zerolog.New(zerolog.NewTestWriter(t)).With().Str("node", name).Logger(),
	}, rdzv)
	require.NoError(t, err)
	go func() {
		o, _ := n.agent.Run(ctx)
		n.done <- o
	}()
	t.Cleanup(func() {
		cancel()
		<-n.done
		_ = rdzv.Close()
	})
	return n
}

// stop stops n as SIGTERM does and returns its outcome.
func (n *etcdAgent) stop() Outcome {
	n.signals <- syscall.SIGTERM
	o := <-n.done
	n.done <- o // for the cleanup
	return o
}

// lines are the lines of file, none when it does not exist (yet).
func lines(file string) []string {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	return strings.Fields(strings.TrimSpace(string(data)))
}

// roundLines are the contracts a worker got over its channel.
func roundLines(t *testing.T, file string) []int {
	data, _ := os.ReadFile(file)
	var sizes []int
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if w, ok, err := heartbeat.ParseRound(l); ok && err == nil {
			sizes = append(sizes, w.WorldSize)
		}
	}
	return sizes
}

// waitFiles waits until every worker of agents wrote want lines (at
// least) to its file kind.<agent>.<local rank>.
func waitFiles(t *testing.T, dir, kind string, want int, agents ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, a := range agents {
			for local := range 2 {
				if len(lines(filepath.Join(dir, fmt.Sprintf("%s.%s.%d", kind, a, local)))) < want {
					return false
				}
			}
		}
		return true
	}, 90*time.Second, 20*time.Millisecond, "%s files of %v", kind, agents)
}

// pids are the pids each worker of agent wrote, by local rank.
func pids(dir, agent string) [][]string {
	var out [][]string
	for local := range 2 {
		out = append(out, lines(filepath.Join(dir, fmt.Sprintf("pids.%s.%d", agent, local))))
	}
	return out
}

// killNode makes n's node die: its etcd client goes silent (its lease
// expires after the TTL), its workers are SIGKILLed, its agent stops.
func killNode(t *testing.T, dir string, n *etcdAgent) {
	t.Helper()
	require.NoError(t, n.client.Close())
	for _, p := range pids(dir, n.name) {
		pid, err := strconv.Atoi(p[len(p)-1])
		require.NoError(t, err)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	n.cancel()
}

// A node lost: the survivors' workers go on in place. Their processes
// are the same, each got the new round's contract (world size 4) over
// its channel, none was restarted, node rank 0 logs the recovery and
// gorun status finds it.
func TestInPlaceNodeLoss(t *testing.T) {
	eps := etcdtest.Start(t).Endpoints()
	dir := t.TempDir()
	a := startEtcdAgent(t, eps, "job", "a", dir, time.Minute)
	b := startEtcdAgent(t, eps, "job", "b", dir, time.Minute)
	c := startEtcdAgent(t, eps, "job", "c", dir, time.Minute)
	waitFiles(t, dir, "pids", 1, "a", "b", "c")
	before := [][][]string{pids(dir, "a"), pids(dir, "b")}

	killNode(t, dir, c)
	waitFiles(t, dir, "rounds", 1, "a", "b")
	require.Equal(t, before, [][][]string{pids(dir, "a"), pids(dir, "b")}, "the survivors' workers are the same processes, none restarted")
	for _, n := range []string{"a", "b"} {
		for local := range 2 {
			require.Equal(t, []int{4}, roundLines(t, filepath.Join(dir, fmt.Sprintf("rounds.%s.%d", n, local))))
		}
	}
	require.Eventually(t, func() bool {
		return strings.Contains(a.report.String()+b.report.String(), "node c lost at step 1; in place on 2 nodes (4 workers), 0 steps lost")
	}, 30*time.Second, 20*time.Millisecond, "reports: %q %q", a.report, b.report)
	st, err := etcdstore.NewConn(etcdtest.NewClient(t, eps...)).ReadStatus(context.Background(), "job")
	require.NoError(t, err)
	require.Len(t, st.Recoveries, 1)
	require.Equal(t, []string{"c"}, st.Recoveries[0].Lost)
	require.Equal(t, 0, st.State.Failures, "a node loss spends no worker-failure restart")

	for _, n := range []*etcdAgent{a, b} {
		require.Equal(t, 128+int(syscall.SIGTERM), n.stop().ExitCode)
	}
}

// The node with rank 0 lost: the survivors' workers, kept, take new
// ranks, and their output goes on under them: every round line a worker
// prints shows on the console as "[host:rank] round ..." with the rank
// of that round.
func TestInPlaceOutputTakesTheNewRank(t *testing.T) {
	eps := etcdtest.Start(t).Endpoints()
	dir := t.TempDir()
	nodes := map[string]*etcdAgent{}
	for _, name := range []string{"a", "b", "c"} {
		nodes[name] = startEtcdAgent(t, eps, "job", name, dir, time.Minute)
	}
	waitFiles(t, dir, "pids", 1, "a", "b", "c")
	var first *etcdAgent
	require.Eventually(t, func() bool {
		for _, n := range nodes {
			if strings.Contains(n.console.String(), fmt.Sprintf("[%s:0] started as 0\n", n.name)) {
				first = n
			}
		}
		return first != nil
	}, 30*time.Second, 10*time.Millisecond, "nobody printed rank 0's start")
	killNode(t, dir, first)
	delete(nodes, first.name)

	moved := 0
	for _, n := range nodes {
		waitFiles(t, dir, "rounds", 1, n.name)
		require.Eventually(t, func() bool {
			return strings.Count(n.console.String(), "] round ") == 2
		}, 30*time.Second, 10*time.Millisecond, "round lines on %s's console: %q", n.name, n.console)
		console := n.console.String()
		for _, l := range strings.Split(console, "\n") {
			prefix, line, _ := strings.Cut(l, "] ")
			w, isRound, err := heartbeat.ParseRound(line)
			if !isRound {
				continue
			}
			require.NoError(t, err)
			require.Equal(t, fmt.Sprintf("[%s:%d", n.name, w.Rank), prefix, "console line %q", l)
			if !strings.Contains(console, fmt.Sprintf("%s] started as %d\n", prefix, w.Rank)) {
				moved++
			}
		}
	}
	require.NotZero(t, moved, "some worker took another rank")
	for _, n := range nodes {
		require.Equal(t, 128+int(syscall.SIGTERM), n.stop().ExitCode)
	}
}

// A worker killed: its agent restarts it alone and every other worker,
// on both nodes, goes on in place (one process each, told the next
// round over its channel); the restart is reported and charged to the
// failure budget, so a worker that keeps failing ends the job once
// --max-restarts (3 here) is spent.
func TestInPlaceWorkerFailureRestartsItAlone(t *testing.T) {
	eps := etcdtest.Start(t).Endpoints()
	dir := t.TempDir()
	a := startEtcdAgent(t, eps, "job", "a", dir, 100*time.Millisecond)
	b := startEtcdAgent(t, eps, "job", "b", dir, 100*time.Millisecond)
	waitFiles(t, dir, "pids", 1, "a", "b")
	kill := func(restarts int) {
		t.Helper()
		p := pids(dir, "a")[1]
		require.Len(t, p, restarts+1)
		pid, err := strconv.Atoi(p[restarts])
		require.NoError(t, err)
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		require.Eventually(t, func() bool { return len(pids(dir, "a")[1]) == restarts+2 }, 90*time.Second, 20*time.Millisecond,
			"rank 1 restarted alone after %d restarts", restarts)
	}
	kill(0)
	waitFiles(t, dir, "rounds", 1, "b")
	require.Eventually(t, func() bool { return len(lines(filepath.Join(dir, "rounds.a.0"))) > 0 }, 90*time.Second, 20*time.Millisecond)
	for _, n := range []string{"a", "b"} {
		for local := range 2 {
			if n == "a" && local == 1 {
				continue
			}
			require.Len(t, pids(dir, n)[local], 1, "%s's local rank %d kept its process", n, local)
			require.Equal(t, []int{4}, roundLines(t, filepath.Join(dir, fmt.Sprintf("rounds.%s.%d", n, local))), "%s's local rank %d told the next round", n, local)
		}
	}
	require.Contains(t, a.report.String(), "restarting rank 1 alone, the other workers go on in place")

	// A crash loop spends the budget: two more restarts, then the fourth
	// failure closes the job.
	kill(1)
	kill(2)
	p := pids(dir, "a")[1]
	pid, err := strconv.Atoi(p[len(p)-1])
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	for _, n := range []*etcdAgent{a, b} {
		o := <-n.done
		n.done <- o
		require.NotZero(t, o.ExitCode, "%s", n.name)
	}
	require.Contains(t, b.report.String(), "restart budget spent")
}

// A node joining a running job: the running nodes keep their workers
// (told world size 6); the new node is a hot spare: it starts its
// workers before it has a round, and the round takes them in with their
// contracts over their channels, not a process start.
func TestInPlaceScaleUp(t *testing.T) {
	eps := etcdtest.Start(t).Endpoints()
	dir := t.TempDir()
	a := startEtcdAgent(t, eps, "job", "a", dir, 100*time.Millisecond)
	b := startEtcdAgent(t, eps, "job", "b", dir, 100*time.Millisecond)
	waitFiles(t, dir, "pids", 1, "a", "b")
	before := [][][]string{pids(dir, "a"), pids(dir, "b")}

	c := startEtcdAgent(t, eps, "job", "c", dir, 100*time.Millisecond)
	waitFiles(t, dir, "rounds", 1, "a", "b")
	waitFiles(t, dir, "pids", 1, "c")
	require.Equal(t, before, [][][]string{pids(dir, "a"), pids(dir, "b")}, "the running nodes' workers are kept")
	for _, n := range []string{"a", "b"} {
		for local := range 2 {
			require.Equal(t, []int{6}, roundLines(t, filepath.Join(dir, fmt.Sprintf("rounds.%s.%d", n, local))))
		}
	}
	waitFiles(t, dir, "rounds", 1, "c")
	for local := range 2 {
		require.Len(t, pids(dir, "c")[local], 1)
		require.Equal(t, []int{6}, roundLines(t, filepath.Join(dir, fmt.Sprintf("rounds.c.%d", local))), "c's local rank %d, started as a hot spare, told its round", local)
	}
	require.Equal(t, 2, strings.Count(c.console.String(), "] standby\n"), "c's workers started before its round: %q", c.console)
	require.NotContains(t, c.console.String(), "started as", "c's round started no fresh worker")
	for _, n := range []*etcdAgent{a, b, c} {
		require.Equal(t, 128+int(syscall.SIGTERM), n.stop().ExitCode)
	}
}

// adopt tells live kept workers their new contracts. One that ended
// meanwhile (beside the failure that changed the round) is recorded as a
// failure of the round before and restarted alone; at a step boundary (an
// intact world) it is refused instead, and the agent starts fresh workers.
func TestAdopt(t *testing.T) {
	a, rdzv, report, dir := adoptingAgent(t, channelWorker)
	first := rendezvous.Round{NumNodes: 1, WorldSize: 2}
	held := startRound(t, a, first)
	waitFiles(t, dir, "pids", 1, "a")
	ctx := context.Background()

	next := rendezvous.Round{Number: 1, NodeRank: 1, NumNodes: 2, FirstRank: 2, WorldSize: 4}
	workers, err := a.adopt(ctx, &first, next, &keep{kind: keepMembership, workers: *held})
	require.NoError(t, err)
	*held = workers
	waitFiles(t, dir, "rounds", 1, "a")
	require.Equal(t, 3, workers[1].contract.Rank)
	require.Equal(t, 1, workers[1].started.Rank, "the contract it started with is kept")

	require.NoError(t, workers[0].process.Signal(syscall.SIGKILL))
	<-workers[0].process.Done()
	_, err = a.adopt(ctx, &next, next, &keep{kind: keepMembership, workers: workers, end: rendezvous.End{Grow: true}})
	require.ErrorContains(t, err, "rank 2 ended while the round changed")

	dead := workers[0]
	third := rendezvous.Round{Number: 2, NodeRank: 1, NumNodes: 2, FirstRank: 2, WorldSize: 4}
	workers, err = a.adopt(ctx, &next, third, &keep{kind: keepMembership, workers: workers})
	require.NoError(t, err)
	*held = workers
	require.NotSame(t, dead, workers[0], "restarted alone")
	require.Equal(t, 2, workers[0].started.Rank, "a fresh worker with the new round's contract")
	require.Contains(t, report.String(), "restarting rank 2 alone in the next round")
	failures, err := rdzv.Failures(ctx)
	require.NoError(t, err)
	require.Len(t, failures, 1)
	require.Equal(t, 2, failures[0].Rank)
	require.Equal(t, 1, failures[0].Attempt, "a failure of the round it ran in")
	require.Equal(t, "SIGKILL", failures[0].Signal)
}

// adoptingAgent is the in-place agent of node "a" (two workers running
// the shell script worker, with DIR and AGENT set, a 5 s stop grace)
// over a static rendezvous, its report, and the workers' DIR.
func adoptingAgent(t *testing.T, worker string) (*Agent, *rendezvous.Static, *testutil.SyncBuffer, string) {
	t.Helper()
	dir := t.TempDir()
	report := &testutil.SyncBuffer{}
	spec := Spec{RunID: "job", Host: "a", LocalWorkers: 2, Command: []string{"sh", "-c", worker},
		Environ: append(os.Environ(), "DIR="+dir, "AGENT=a"), TermTimeout: 5 * time.Second, ErrorDir: t.TempDir(),
		InPlace: true, Report: report, Logs: workerlog.Config{Stdout: &testutil.SyncBuffer{}, Stderr: &testutil.SyncBuffer{}}}
	rdzv := &rendezvous.Static{}
	a, err := New(spec, rdzv)
	require.NoError(t, err)
	return a, rdzv, report, dir
}

// startRound starts a's workers of round r; when the test ends it
// stops and releases the workers held then (a test puts there the
// workers adopt returns).
func startRound(t *testing.T, a *Agent, r rendezvous.Round) *[]*worker {
	t.Helper()
	workers, err := a.startRound(r, nil)
	require.NoError(t, err)
	held := &workers
	t.Cleanup(func() {
		a.stopAll(*held, syscall.SIGTERM)
		a.release(*held)
	})
	return held
}

// closingWorker is channelWorker that, on SIGUSR2, closes its channel,
// says so in $DIR/closed.AGENT.LOCAL_RANK and exits 3 a second later: a
// worker on its way out whose end its agent has not seen yet.
const closingWorker = `trap 'exec 3>&-; echo closed >> "$DIR/closed.$AGENT.$LOCAL_RANK"; sleep 1; exit 3' USR2
` + channelWorker

// A kept worker whose channel has closed when the new round is sent to it
// (the send fails: EPIPE), and which ends within the stop grace, is
// restarted alone in the new round and recorded as a failure of the round
// it ran in, like one that had already ended (TestAdopt); its peer on the
// node is kept.
func TestAdoptAfterItsChannelClosed(t *testing.T) {
	a, rdzv, report, dir := adoptingAgent(t, closingWorker)
	first := rendezvous.Round{NumNodes: 1, WorldSize: 2}
	held := startRound(t, a, first)
	workers := *held
	waitFiles(t, dir, "pids", 1, "a")
	require.NoError(t, workers[1].process.Signal(syscall.SIGUSR2))
	require.Eventually(t, func() bool { return len(lines(filepath.Join(dir, "closed.a.1"))) == 1 },
		90*time.Second, 20*time.Millisecond, "worker 1 closes its channel")

	kept, closing := workers[0], workers[1]
	next := rendezvous.Round{Number: 1, NodeRank: 1, NumNodes: 2, FirstRank: 2, WorldSize: 4}
	workers, err := a.adopt(context.Background(), &first, next, &keep{kind: keepMembership, workers: workers})
	require.NoError(t, err)
	*held = workers
	require.Same(t, kept, workers[0], "its peer is kept")
	require.Equal(t, 2, workers[0].contract.Rank)
	require.NotSame(t, closing, workers[1], "restarted alone")
	require.Equal(t, 3, workers[1].started.Rank, "a fresh worker with the new round's contract")
	require.Contains(t, report.String(), "restarting rank 1 alone in the next round")
	failures, err := rdzv.Failures(context.Background())
	require.NoError(t, err)
	require.Len(t, failures, 1)
	require.Equal(t, 1, failures[0].Rank)
	require.Equal(t, 0, failures[0].Attempt, "a failure of the round it ran in")
	require.Equal(t, 3, failures[0].ExitCode)
}

// A spare (a fourth node of a job of at most three) waits with its
// workers started and idle (a hot spare: they hold no state yet); SLURM's
// warning (SIGUSR1) makes it stop them and exit 75 at once, as the
// members' agents do once their workers checkpointed, instead of holding
// the job's end.
func TestSpareRequeuesOnSIGUSR1(t *testing.T) {
	eps := etcdtest.Start(t).Endpoints()
	dir := t.TempDir()
	for _, n := range []string{"a", "b", "c"} {
		startEtcdAgent(t, eps, "job", n, dir, 100*time.Millisecond)
	}
	waitFiles(t, dir, "pids", 1, "a", "b", "c")
	spare := startEtcdAgent(t, eps, "job", "d", dir, 100*time.Millisecond)
	spare.signals <- syscall.SIGUSR1
	o := <-spare.done
	spare.done <- o
	require.Equal(t, ExitRequeue, o.ExitCode, o.Reason)
	require.True(t, o.Requeue)
	require.Contains(t, spare.report.String(), "SIGUSR1 while waiting for a round, with no workers to checkpoint")
	for _, p := range pids(dir, "d") {
		for _, pid := range p {
			n, err := strconv.Atoi(pid)
			require.NoError(t, err)
			require.ErrorIs(t, syscall.Kill(n, 0), syscall.ESRCH, "the spare's worker %d is stopped", n)
		}
	}
}

// requeueWorker stops for a requeue as the embedded trainer does when
// any rank was asked to (its ranks agree on the stop): a SIGUSR1 to any
// worker of the job makes every worker, on every node, say on its
// channel that it stops to be requeued and exit 75.
const requeueWorker = `trap 'touch "$DIR/stop"' USR1
echo $$ >> "$DIR/pids.$AGENT.$LOCAL_RANK"
echo 1 >&3
while [ ! -e "$DIR/stop" ]; do sleep 0.02; done
echo requeue >&3
exit 75`

// SLURM's warning reaches one node's gorun only (or the other's much
// later): the other node's workers stop for the requeue all the same,
// told by their peers, and its agent, which was passed no signal, takes
// their exit 75 for the requeue it is, not for a failure to recover
// from in place. Both agents exit 75 asking for the requeue.
func TestRequeueSeenFromThePeers(t *testing.T) {
	eps := etcdtest.Start(t).Endpoints()
	dir := t.TempDir()
	a := startEtcdAgentOf(t, eps, "job", "a", dir, 100*time.Millisecond, requeueWorker)
	b := startEtcdAgentOf(t, eps, "job", "b", dir, 100*time.Millisecond, requeueWorker)
	waitFiles(t, dir, "pids", 1, "a", "b")
	b.signals <- syscall.SIGUSR1
	for _, n := range []*etcdAgent{a, b} {
		o := <-n.done
		n.done <- o // for the cleanup
		require.Equal(t, ExitRequeue, o.ExitCode, "%s: %s\nreport:\n%s", n.name, o.Reason, n.report)
		require.True(t, o.Requeue, n.name)
		require.Zero(t, o.Restarts, "%s: a requeue spends no restart", n.name)
	}
	require.NotContains(t, a.report.String(), "alone", "a's workers were not restarted")
	for _, p := range pids(dir, "a") {
		require.Len(t, p, 1, "a's workers were not restarted")
	}
}

// "Restart rank k alone" is one value: a keep of kind keepRespawn names
// the local rank to replace, and adopt starts a fresh worker there with
// the new round's contract while its peer is kept and told the round.
func TestAdoptReplacesTheRankRestartedAlone(t *testing.T) {
	a, _, _, dir := adoptingAgent(t, channelWorker)
	first := rendezvous.Round{NumNodes: 1, WorldSize: 2}
	held := startRound(t, a, first)
	waitFiles(t, dir, "pids", 1, "a")
	survivor, failed := (*held)[0], (*held)[1]
	require.NoError(t, failed.process.Signal(syscall.SIGKILL))
	<-failed.process.Done()
	a.release([]*worker{failed})
	*held = []*worker{survivor}

	next := rendezvous.Round{Number: 1, NumNodes: 1, WorldSize: 2}
	k := &keep{kind: keepRespawn, workers: []*worker{survivor}, replace: []int{1},
		end: rendezvous.End{Cause: rendezvous.CauseFailure, InPlace: true}}
	workers, err := a.adopt(context.Background(), &first, next, k)
	require.NoError(t, err)
	*held = workers
	require.Len(t, workers, 2)
	require.Same(t, survivor, workers[0], "its peer is kept")
	require.NotSame(t, failed, workers[1], "restarted alone")
	require.Equal(t, 1, workers[1].started.Rank)
	require.Equal(t, 1, workers[1].started.RestartCount, "with the new round's contract")
	require.Eventually(t, func() bool { return len(lines(filepath.Join(dir, "rounds.a.0"))) > 0 }, 90*time.Second, 20*time.Millisecond,
		"the kept worker is told the new round")
	require.Equal(t, []int{2}, roundLines(t, filepath.Join(dir, "rounds.a.0")))
	require.Len(t, pids(dir, "a")[0], 1, "the kept worker kept its process")
	require.Eventually(t, func() bool { return len(pids(dir, "a")[1]) == 2 }, 90*time.Second, 20*time.Millisecond,
		"a second process in rank 1's place")
}
