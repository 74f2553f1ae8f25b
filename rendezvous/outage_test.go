package rendezvous_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/rdzvtest"
)

// outageConfig is config with a grace (lease TTL) of grace.
func outageConfig(host string, lim rendezvous.Limits, grace time.Duration) rendezvous.Config {
	cfg := config(host, -1, lim)
	cfg.LeaseTTL = grace
	return cfg
}

// An etcd outage expires every lease; nodes that put their keys back
// within the grace are no membership change: the round goes on, and the
// next round (opened by a new node) keeps their node ranks although they
// re-registered in reverse order.
func TestOutageMembersBackWithinGraceKeepTheRound(t *testing.T) {
	b := rdzvtest.NewBackend()
	lim := rendezvous.Limits{MinNodes: 2, MaxNodes: 4, MaxFailures: 1, MaxChanges: 3}
	const grace = time.Hour // never ends within the test: the rule, not the clock, is tested
	nodes := []*node{join(t, b, outageConfig("a", lim, grace)), join(t, b, outageConfig("b", lim, grace)), join(t, b, outageConfig("c", lim, grace))}
	first := nextAll(t, nodes...)
	requireConsistent(t, first, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var watches []<-chan rendezvous.End
	for i, n := range nodes {
		watches = append(watches, n.rdzv.Watch(ctx, first[i]))
	}

	for _, n := range nodes {
		n.store.Outage() // every key of every node vanishes
	}
	for i := len(nodes) - 1; i >= 0; i-- {
		nodes[i].store.Restore()
	}
	// The first change of the round after the outage is the new node's.
	cfgD := outageConfig("d", lim, grace)
	cfgD.LastCall = time.Hour // round 1 forms when all four joined
	d := join(t, b, cfgD)
	type result struct {
		round rendezvous.Round
		err   error
	}
	dRound := make(chan result, 1)
	go func() {
		r, err := d.rdzv.Next(ctx)
		dRound <- result{r, err}
	}()
	for _, w := range watches {
		end := <-w
		require.Equal(t, "node d waiting to join", end.Reason)
	}
	second := nextAll(t, nodes...)
	got := <-dRound
	require.NoError(t, got.err)
	require.Equal(t, 1, got.round.Number)
	for i, r := range second {
		require.Equal(t, 1, r.Number)
		require.Equal(t, first[i].NodeRank, r.NodeRank, "node %s kept its rank", nodes[i].host)
	}
	require.Equal(t, 3, got.round.NodeRank)
}

// A node that does not put its keys back within the grace after the
// outage is lost: the others open the next round without it.
func TestOutageMemberNotBackIsLostAfterGrace(t *testing.T) {
	b := rdzvtest.NewBackend()
	const grace = 200 * time.Millisecond
	nodes := []*node{join(t, b, outageConfig("a", testLimits, grace)), join(t, b, outageConfig("b", testLimits, grace)), join(t, b, outageConfig("c", testLimits, grace))}
	first := nextAll(t, nodes...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watchA, watchB := nodes[0].rdzv.Watch(ctx, first[0]), nodes[1].rdzv.Watch(ctx, first[1])

	for _, n := range nodes {
		n.store.Outage()
	}
	nodes[0].store.Restore()
	nodes[1].store.Restore() // c never comes back
	for _, w := range []<-chan rendezvous.End{watchA, watchB} {
		end := <-w
		require.Contains(t, end.Reason, "node c (node 2) left")
		require.NotContains(t, end.Reason, "node a")
		require.NotContains(t, end.Reason, "node b")
	}
	second := nextAll(t, nodes[0], nodes[1])
	requireConsistent(t, second, 2)
	require.Equal(t, []int{0, 1}, []int{second[0].NodeRank, second[1].NodeRank})
}

// An agent whose etcd stays away for join_timeout while it waits to
// report its workers' success fails with ErrEtcdUnreachable.
func TestOutageLongerThanJoinTimeoutFailsTheReport(t *testing.T) {
	b := rdzvtest.NewBackend()
	lim := rendezvous.Limits{MinNodes: 2, MaxNodes: 2}
	cfgA := outageConfig("a", lim, 100*time.Millisecond)
	cfgA.JoinTimeout = time.Second
	a := join(t, b, cfgA)
	bb := join(t, b, outageConfig("b", lim, 100*time.Millisecond))
	rounds := nextAll(t, a, bb) // forms at MAX nodes, at once

	done := make(chan error, 1)
	go func() {
		_, err := a.rdzv.Succeeded(context.Background(), rounds[0])
		done <- err
	}()
	key := "rounds/00000000/done/a-id"
	for {
		if _, ok := b.Value(key); ok {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	a.store.Outage() // b has not finished: a waits, and etcd is gone
	err := <-done
	require.True(t, errors.Is(err, rendezvous.ErrEtcdUnreachable), "got %v", err)
	require.ErrorContains(t, err, "join_timeout=1s")
}
