package rendezvous_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/rdzvtest"
)

// etcd's own servers leave a few goroutines winding down; etcdtest knows which.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.GoleakOptions()...) }

// testLimits: 2..3 nodes, 2 failure restarts, 3 membership changes.
var testLimits = rendezvous.Limits{MinNodes: 2, MaxNodes: 3, MaxFailures: 2, MaxChanges: 3}

type node struct {
	store *rdzvtest.Store
	rdzv  *rendezvous.Elastic
	host  string
}

func config(host string, preferred int, lim rendezvous.Limits) rendezvous.Config {
	return rendezvous.Config{
		Self:   rendezvous.Member{ID: host + "-id", Host: host, Addr: "127.0.0.1", Preferred: preferred, NProc: 2},
		Limits: lim, LastCall: 300 * time.Millisecond, JoinTimeout: 10 * time.Second,
		FreePort: func(string) (int, error) { return 29500, nil },
		Log:      zerolog.Nop(),
	}
}

func join(t *testing.T, b *rdzvtest.Backend, cfg rendezvous.Config) *node {
	t.Helper()
	s := b.Store()
	e, err := rendezvous.Join(context.Background(), s, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return &node{store: s, rdzv: e, host: cfg.Self.Host}
}

// nextAll runs Next on every node at once and returns their rounds.
func nextAll(t *testing.T, nodes ...*node) []rendezvous.Round {
	t.Helper()
	rounds := make([]rendezvous.Round, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			rounds[i], errs[i] = n.rdzv.Next(ctx)
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	return rounds
}

// requireConsistent checks that rounds form one job: one round number, one
// master, node ranks 0..n-1 once each, contiguous global ranks.
func requireConsistent(t *testing.T, rounds []rendezvous.Round, nodes int) {
	t.Helper()
	ranks := map[int]bool{}
	first := map[int]bool{}
	for _, r := range rounds {
		require.Equal(t, rounds[0].Number, r.Number)
		require.Equal(t, rounds[0].MasterPort, r.MasterPort)
		require.Equal(t, nodes, r.NumNodes)
		require.Equal(t, 2*nodes, r.WorldSize)
		require.Equal(t, 2*r.NodeRank, r.FirstRank)
		ranks[r.NodeRank] = true
		first[r.FirstRank] = true
	}
	require.Len(t, ranks, nodes)
	require.Len(t, first, nodes)
}

func TestFormsAtMaxNodes(t *testing.T) {
	b := rdzvtest.NewBackend()
	a, bb, c := join(t, b, config("a", -1, testLimits)), join(t, b, config("b", -1, testLimits)), join(t, b, config("c", -1, testLimits))
	rounds := nextAll(t, a, bb, c)
	requireConsistent(t, rounds, 3)
	require.Equal(t, 0, rounds[0].Number)
}

func TestPreferredRanks(t *testing.T) {
	b := rdzvtest.NewBackend()
	nodes := []*node{join(t, b, config("x", 2, testLimits)), join(t, b, config("y", 0, testLimits)), join(t, b, config("z", 1, testLimits))}
	rounds := nextAll(t, nodes...)
	require.Equal(t, []int{2, 0, 1}, []int{rounds[0].NodeRank, rounds[1].NodeRank, rounds[2].NodeRank})
}

func TestFormsAtMinNodesAfterLastCall(t *testing.T) {
	b := rdzvtest.NewBackend()
	rounds := nextAll(t, join(t, b, config("a", -1, testLimits)), join(t, b, config("b", -1, testLimits)))
	requireConsistent(t, rounds, 2)
}

func TestBelowMinNodesTimesOut(t *testing.T) {
	b := rdzvtest.NewBackend()
	cfg := config("lonely", -1, testLimits)
	cfg.JoinTimeout = 100 * time.Millisecond
	n := join(t, b, cfg)
	_, err := n.rdzv.Next(context.Background())
	require.ErrorContains(t, err, "round 0 did not form within join_timeout=100ms: 1 of at least 2 nodes joined (lonely)")
}

func TestNodeLossOpensNextRound(t *testing.T) {
	b := rdzvtest.NewBackend()
	nodes := []*node{join(t, b, config("a", -1, testLimits)), join(t, b, config("b", -1, testLimits)), join(t, b, config("c", -1, testLimits))}
	first := nextAll(t, nodes...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watchA, watchB := nodes[0].rdzv.Watch(ctx, first[0]), nodes[1].rdzv.Watch(ctx, first[1])

	nodes[2].store.Kill() // node c dies: its lease expires
	for _, w := range []<-chan rendezvous.End{watchA, watchB} {
		end := <-w
		require.False(t, end.Closed)
		require.Contains(t, end.Reason, "node c (node")
		require.Contains(t, end.Reason, "left")
		require.Equal(t, rendezvous.CauseMembership, end.Cause, "a node loss leaves the other workers intact")
		require.Equal(t, []string{"c"}, end.Lost)
	}
	second := nextAll(t, nodes[0], nodes[1])
	requireConsistent(t, second, 2)
	require.Equal(t, 1, second[0].Number, "TORCHELASTIC_RESTART_COUNT goes up")
}

func TestWaitingNodeScalesUp(t *testing.T) {
	b := rdzvtest.NewBackend()
	a, bb := join(t, b, config("a", -1, testLimits)), join(t, b, config("b", -1, testLimits))
	first := nextAll(t, a, bb)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch := a.rdzv.Watch(ctx, first[0])

	c := join(t, b, config("c", -1, testLimits))
	var cRound rendezvous.Round
	var cErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		cRound, cErr = c.rdzv.Next(ctx)
	}()
	end := <-watch
	require.Contains(t, end.Reason, "node c waiting to join")
	require.Equal(t, rendezvous.CauseMembership, end.Cause)
	require.Empty(t, end.Lost)
	rounds := nextAll(t, a, bb)
	<-done
	require.NoError(t, cErr)
	requireConsistent(t, append(rounds, cRound), 3)
}

func TestFailureBudget(t *testing.T) {
	b := rdzvtest.NewBackend()
	lim := testLimits
	lim.MaxFailures = 1
	a, bb := join(t, b, config("a", -1, lim)), join(t, b, config("b", -1, lim))
	ctx := context.Background()
	r := nextAll(t, a, bb)
	fail := rendezvous.Failure{Host: "b", Rank: 3, ExitCode: 7, Time: time.Now(), Error: "ValueError: x"}
	end, err := bb.rdzv.Failed(ctx, r[1], []rendezvous.Failure{fail})
	require.NoError(t, err)
	require.False(t, end.Closed)
	require.Equal(t, rendezvous.CauseFailure, end.Cause, "a worker failure restarts everyone")

	r = nextAll(t, a, bb)
	require.Equal(t, 1, r[0].Number)
	fail.Time, fail.Rank = time.Now(), 0
	end, err = a.rdzv.Failed(ctx, r[0], []rendezvous.Failure{fail})
	require.NoError(t, err)
	require.True(t, end.Closed)
	require.Equal(t, rendezvous.ResultFailed, end.Result)
	require.Contains(t, end.Reason, "restart budget spent (1 of --max-restarts=1 used)")

	_, err = bb.rdzv.Next(ctx)
	var closed *rendezvous.ClosedError
	require.ErrorAs(t, err, &closed)

	failures, err := bb.rdzv.Failures(ctx)
	require.NoError(t, err)
	require.Len(t, failures, 2)
	require.Equal(t, 3, failures[0].Rank, "first failure first")
}

func TestAllSucceededClosesTheJob(t *testing.T) {
	b := rdzvtest.NewBackend()
	nodes := []*node{join(t, b, config("a", -1, testLimits)), join(t, b, config("b", -1, testLimits))}
	rounds := nextAll(t, nodes...)
	ends := make([]rendezvous.End, 2)
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			var err error
			ends[i], err = n.rdzv.Succeeded(context.Background(), rounds[i])
			require.NoError(t, err)
		})
	}
	wg.Wait()
	for _, end := range ends {
		require.True(t, end.Closed)
		require.Equal(t, rendezvous.ResultSucceeded, end.Result)
	}
}

func TestSucceededNodeRejoinsWhenAnotherLeaves(t *testing.T) {
	b := rdzvtest.NewBackend()
	nodes := []*node{join(t, b, config("a", -1, testLimits)), join(t, b, config("b", -1, testLimits)), join(t, b, config("c", -1, testLimits))}
	rounds := nextAll(t, nodes...)
	got := make(chan rendezvous.End, 1)
	go func() {
		end, err := nodes[0].rdzv.Succeeded(context.Background(), rounds[0])
		require.NoError(t, err)
		got <- end
	}()
	nodes[2].store.Kill()
	end := <-got
	require.False(t, end.Closed, "a new round opened: the finished node joins it")
}

func TestMembershipBudget(t *testing.T) {
	b := rdzvtest.NewBackend()
	lim := testLimits
	lim.MaxChanges = 0
	nodes := []*node{join(t, b, config("a", -1, lim)), join(t, b, config("b", -1, lim)), join(t, b, config("c", -1, lim))}
	rounds := nextAll(t, nodes...)
	watch := nodes[0].rdzv.Watch(context.Background(), rounds[0])
	nodes[2].store.Kill()
	end := <-watch
	require.True(t, end.Closed)
	require.Contains(t, end.Reason, "membership-change budget spent")
}

func TestManyNodes(t *testing.T) {
	b := rdzvtest.NewBackend()
	lim := rendezvous.Limits{MinNodes: 32, MaxNodes: 32}
	var nodes []*node
	for i := range 32 {
		nodes = append(nodes, join(t, b, config(fmt.Sprintf("n%02d", i), -1, lim)))
	}
	rounds := nextAll(t, nodes...)
	var ranks []int
	for _, r := range rounds {
		ranks = append(ranks, r.NodeRank)
	}
	sort.Ints(ranks)
	for i, r := range ranks {
		require.Equal(t, i, r)
	}
}

// A node that dies breaks its peers' workers before its lease expires: the
// restart their failures opened is charged to the node loss once it shows.
func TestNodeLossSeenFirstAsWorkerFailures(t *testing.T) {
	b := rdzvtest.NewBackend()
	lim := testLimits
	lim.MaxFailures = 1
	nodes := []*node{join(t, b, config("a", -1, lim)), join(t, b, config("b", -1, lim)), join(t, b, config("c", -1, lim))}
	rounds := nextAll(t, nodes...)
	ctx := context.Background()
	broken := rendezvous.Failure{Host: "a", Rank: 0, ExitCode: 1, Time: time.Now(), Error: "RuntimeError: connection closed by peer"}
	end, err := nodes[0].rdzv.Failed(ctx, rounds[0], []rendezvous.Failure{broken})
	require.NoError(t, err)
	require.False(t, end.Closed)
	nodes[2].store.Kill() // c's lease expires only now

	second := nextAll(t, nodes[0], nodes[1])
	requireConsistent(t, second, 2)
	var st rendezvous.State
	raw, _ := b.Value("state")
	require.NoError(t, json.Unmarshal(raw, &st))
	require.Equal(t, 0, st.Failures, "the restart is the node loss's, not a worker failure's")
	require.Equal(t, 1, st.Changes)
	require.Contains(t, st.Reason, "node c left")
	failures, err := nodes[0].rdzv.Failures(ctx)
	require.NoError(t, err)
	require.Equal(t, "node lost", failures[0].Signal, "the lost node is the first failure")
	require.Equal(t, "c", failures[0].Host)
}

// With the restart budget spent, a worker failure waits out the lease TTL
// for a node loss that explains it before it closes the job.
func TestSpentBudgetWaitsForNodeLoss(t *testing.T) {
	for _, nodeDies := range []bool{true, false} {
		t.Run(fmt.Sprintf("node dies %v", nodeDies), func(t *testing.T) {
			b := rdzvtest.NewBackend()
			lim := testLimits
			lim.MaxFailures = 0
			var nodes []*node
			for _, h := range []string{"a", "b", "c"} {
				cfg := config(h, -1, lim)
				cfg.LeaseTTL = 200 * time.Millisecond
				nodes = append(nodes, join(t, b, cfg))
			}
			rounds := nextAll(t, nodes...)
			if nodeDies {
				time.AfterFunc(100*time.Millisecond, nodes[2].store.Kill)
			}
			end, err := nodes[0].rdzv.Failed(context.Background(), rounds[0],
				[]rendezvous.Failure{{Host: "a", Rank: 0, ExitCode: 1, Time: time.Now()}})
			require.NoError(t, err)
			require.Equal(t, !nodeDies, end.Closed)
			if nodeDies {
				require.Contains(t, end.Reason, "node c")
			} else {
				require.Contains(t, end.Reason, "restart budget spent")
			}
		})
	}
}

// A spare waits as long as the job runs without it, however long that is
// past join_timeout: giving up would close the job for everyone. Only
// its context ends the wait here.
func TestSpareWaitsPastJoinTimeout(t *testing.T) {
	b := rdzvtest.NewBackend()
	lim := rendezvous.Limits{MinNodes: 2, MaxNodes: 2, MaxFailures: 1, MaxChanges: 1}
	nextAll(t, join(t, b, config("a", -1, lim)), join(t, b, config("b", -1, lim)))
	cfg := config("spare", -1, lim)
	cfg.JoinTimeout = 100 * time.Millisecond
	spare := join(t, b, cfg)
	ctx, cancel := context.WithTimeoutCause(context.Background(), 10*cfg.JoinTimeout, errors.New("the test is over"))
	defer cancel()
	_, err := spare.rdzv.Next(ctx)
	require.EqualError(t, err, "the test is over")
}

// RunsWithout tells a node that the job runs a round without it (so its
// agent can start its workers as a hot spare before it waits), and not
// when it joins a job that has yet to form, or runs in the round.
func TestRunsWithout(t *testing.T) {
	b := rdzvtest.NewBackend()
	lim := rendezvous.Limits{MinNodes: 2, MaxNodes: 2, MaxFailures: 1, MaxChanges: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := join(t, b, config("a", -1, lim))
	require.False(t, a.rdzv.RunsWithout(ctx), "no round runs yet")
	bb := join(t, b, config("b", -1, lim))
	nextAll(t, a, bb)
	require.False(t, a.rdzv.RunsWithout(ctx), "a runs in the round")
	spare := join(t, b, config("spare", -1, lim))
	require.True(t, spare.rdzv.RunsWithout(ctx), "the round runs without the spare")
}
