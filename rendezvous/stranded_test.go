package rendezvous_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/rdzvtest"
)

// A node whose join key lands after the round froze without it (it was
// counted lost meanwhile, as under packet loss) learns that the round did
// not take it, waits as a registered node, and is taken into the next
// round. Its bucket held no other node: before every bucket was written
// with every round, it waited for a placement that never came, unseen.
func TestLateJoinerIsTakenIntoTheNextRound(t *testing.T) {
	b := rdzvtest.NewBackend()
	require.NotEqual(t, rendezvous.BucketOf("b-id"), rendezvous.BucketOf("a-id"))
	require.NotEqual(t, rendezvous.BucketOf("b-id"), rendezvous.BucketOf("c-id"))
	sawRound1, release := make(chan struct{}), make(chan struct{})
	var offers atomic.Int32
	cfgB := config("b", -1, testLimits)
	cfgB.FreePort = func(string) (int, error) {
		if offers.Add(1) == 2 { // b saw round 1 joinable and is about to join it
			close(sawRound1)
			<-release
		}
		return 29500, nil
	}
	a, bb, c := join(t, b, config("a", -1, testLimits)), join(t, b, cfgB), join(t, b, config("c", -1, testLimits))
	rounds := nextAll(t, a, bb, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	end, err := a.rdzv.Failed(ctx, rounds[0], []rendezvous.Failure{{Host: "a", Rank: 0, ExitCode: 1, Time: time.Now()}})
	require.NoError(t, err)
	require.False(t, end.Closed)

	type result struct {
		r   rendezvous.Round
		err error
	}
	lateB := make(chan result, 1)
	go func() {
		r, err := bb.rdzv.Next(ctx)
		lateB <- result{r, err}
	}()
	<-sawRound1
	bb.store.Outage() // b's lease expires before its join key is put: round 1 forms without it
	round1 := nextAll(t, a, c)
	requireConsistent(t, round1, 2)
	bb.store.Restore() // b's join key for round 1 lands after the freeze
	close(release)

	for i, n := range []*node{a, c} {
		end, ok := <-n.rdzv.Watch(ctx, round1[i])
		require.True(t, ok, "round 1 ended for %s: the late node b must be taken in", n.host)
		require.Equal(t, rendezvous.CauseMembership, end.Cause)
		require.Contains(t, end.Reason, "node b waiting to join")
	}
	round2 := nextAll(t, a, c)
	got := <-lateB
	require.NoError(t, got.err)
	requireConsistent(t, append(round2, got.r), 3)
	require.Equal(t, 2, got.r.Number)
}
