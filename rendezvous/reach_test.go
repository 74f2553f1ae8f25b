package rendezvous_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/rdzvtest"
)

func TestLeaveOut(t *testing.T) {
	members := []rendezvous.Member{{ID: "a"}, {ID: "b"}, {ID: "c"}, {ID: "d"}}
	for _, tc := range []struct {
		name    string
		reports map[string][]string
		want    []string
	}{
		{"nothing reported", nil, []string{}},
		{"one way: the node reported goes", map[string][]string{"a": {"c"}}, []string{"c"}},
		{"both ways: the higher node rank goes", map[string][]string{"a": {"c"}, "c": {"a"}}, []string{"c"}},
		{"a lossy node reported by all its peers", map[string][]string{"a": {"b"}, "c": {"b"}, "d": {"b"}}, []string{"b"}},
		{"a node that reaches nobody", map[string][]string{"d": {"a", "b", "c"}}, []string{"d"}},
		{"the reporter is reported by more", map[string][]string{"a": {"b"}, "b": {"d"}, "c": {"b"}}, []string{"b"}},
		{"two separate pairs", map[string][]string{"a": {"b"}, "c": {"d"}}, []string{"b", "d"}},
		{"strangers and itself are ignored", map[string][]string{"x": {"a"}, "a": {"y", "a"}}, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, rendezvous.LeaveOut(members, tc.reports))
		})
	}
}

// gate answers reachability probes as an agent does (package reach) while
// open; closed, it takes connections and never answers, as a node does
// whose packets back are dropped.
type gate struct {
	l      net.Listener
	closed atomic.Bool
	wg     sync.WaitGroup
}

func newGate(t *testing.T) *gate {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := &gate{l: l}
	var held []net.Conn
	g.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			if g.closed.Load() {
				held = append(held, c)
				continue
			}
			var b [1]byte
			if _, err := c.Read(b[:]); err == nil {
				_, _ = c.Write(b[:])
			}
			c.Close()
		}
	})
	t.Cleanup(func() { l.Close(); g.wg.Wait() })
	return g
}

func (g *gate) port() int { return g.l.Addr().(*net.TCPAddr).Port }

// A node that another member cannot reach (its probes go unanswered) is
// left out of the next round, which forms without waiting for it; it
// joins again once it reaches every member, and its workers' silences
// about a rank of its own node are no report.
func TestUnreachableNodeIsLeftOut(t *testing.T) {
	b := rdzvtest.NewBackend()
	gates := []*gate{newGate(t), newGate(t), newGate(t)}
	var nodes []*node
	for i, host := range []string{"a", "b", "c"} {
		cfg := config(host, i, testLimits)
		cfg.Self.Reach = gates[i].port()
		nodes = append(nodes, join(t, b, cfg))
	}
	first := nextAll(t, nodes...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watchA := nodes[0].rdzv.Watch(ctx, first[0])

	require.NoError(t, nodes[0].rdzv.Unreachable(ctx, first[0], 1), "rank 1 is a's own")
	for _, g := range gates {
		g.closed.Store(true) // c's link is cut: a's probe of c, c's of a and b go unanswered
	}
	require.NoError(t, nodes[0].rdzv.Unreachable(ctx, first[0], 4))
	end := <-watchA
	require.Equal(t, rendezvous.CauseMembership, end.Cause)
	require.Equal(t, []string{"c"}, end.Lost)
	require.Contains(t, end.Reason, "node c (a could not reach it) left out")

	var cRound rendezvous.Round
	var cErr error
	cDone := make(chan struct{})
	go func() {
		defer close(cDone)
		cRound, cErr = nodes[2].rdzv.Next(ctx)
	}()
	second := nextAll(t, nodes[0], nodes[1])
	requireConsistent(t, second, 2)

	watchA = nodes[0].rdzv.Watch(ctx, second[0])
	for _, g := range gates {
		g.closed.Store(false) // healed
	}
	end = <-watchA
	require.Contains(t, end.Reason, "node c waiting to join")
	third := nextAll(t, nodes[0], nodes[1])
	<-cDone
	require.NoError(t, cErr)
	requireConsistent(t, append(third, cRound), 3)
}

// A survivor whose two peers' agents died with their kernels up (their
// probe ports refuse) fences them: their registrations go, and the job
// goes on with the survivor alone at once, with no lease to wait out.
// LeaveOut, weighing the reports, would have left the survivor out: it is
// in both reported pairs. Peers fenced that are alive after all register
// again and join the next round as new nodes do.
func TestRefusedProbeFencesTheDeadNodes(t *testing.T) {
	b := rdzvtest.NewBackend()
	lim := rendezvous.Limits{MinNodes: 1, MaxNodes: 3, MaxFailures: 2, MaxChanges: 5}
	gates := []*gate{newGate(t), newGate(t), newGate(t)}
	var nodes []*node
	for i, host := range []string{"a", "b", "c"} {
		cfg := config(host, i, lim)
		cfg.Self.Reach = gates[i].port()
		nodes = append(nodes, join(t, b, cfg))
	}
	rounds := nextAll(t, nodes...)
	requireConsistent(t, rounds, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, g := range gates[1:] {
		require.NoError(t, g.l.Close()) // b's and c's agents are gone: their ports refuse
	}
	require.NoError(t, nodes[0].rdzv.Unreachable(ctx, rounds[0], 2))
	require.NoError(t, nodes[0].rdzv.Unreachable(ctx, rounds[0], 4))
	r := rounds[0]
	for r.NumNodes != 1 {
		end := <-nodes[0].rdzv.Watch(ctx, r)
		require.False(t, end.Closed, end.Reason)
		require.NotContains(t, end.Lost, "a", "the survivor is not left out")
		var err error
		r, err = nodes[0].rdzv.Next(ctx)
		require.NoError(t, err)
	}
	require.Equal(t, 0, r.NodeRank)
	failures, err := nodes[0].rdzv.Failures(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, failures)
	require.Contains(t, failures[0].Error, "refused a peer's probe")

	// b and c were alive all along: they register again and come back.
	requireConsistent(t, nextAll(t, nodes...), 3)
}

// A node that evicts itself (a straggler) leaves the job for good: the
// round it ran ends for the others as a membership change that lost it,
// they go on without waiting for it, its Next says it was evicted, and a
// job at its minimum of nodes refuses to lose one.
func TestEvictedNodeLeavesTheJob(t *testing.T) {
	b := rdzvtest.NewBackend()
	nodes := []*node{join(t, b, config("a", 0, testLimits)), join(t, b, config("b", 1, testLimits)), join(t, b, config("c", 2, testLimits))}
	first := nextAll(t, nodes...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watchA := nodes[0].rdzv.Watch(ctx, first[0])

	require.NoError(t, nodes[2].rdzv.Evict(ctx, "its rank 4 was the job's straggler for 2m0s"))
	end := <-watchA
	require.Equal(t, rendezvous.CauseMembership, end.Cause)
	require.Equal(t, []string{"c"}, end.Lost)
	require.Equal(t, "node c evicted: its rank 4 was the job's straggler for 2m0s", end.Reason)
	_, err := nodes[2].rdzv.Next(ctx)
	var evicted *rendezvous.EvictedError
	require.ErrorAs(t, err, &evicted)

	second := nextAll(t, nodes[0], nodes[1])
	requireConsistent(t, second, 2)
	failures, err := nodes[0].rdzv.Failures(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, failures)
	require.Equal(t, "evicted", failures[0].Signal)
	require.ErrorIs(t, nodes[1].rdzv.Evict(ctx, "slow"), rendezvous.ErrEvictTooFew)
}
