package rendezvous_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/rdzvtest"
)

func TestOrderFailures(t *testing.T) {
	peer := func(r int) *int { return &r }
	// Each case lists failures in the order they are given; want is the
	// ranks (-1: a node or agent) in the order they must come out.
	tests := []struct {
		name     string
		failures []rendezvous.Failure
		want     []int
	}{
		{"by revision, not by clock", []rendezvous.Failure{
			{Rank: 5, Revision: 9, Time: time.Unix(1, 0)},
			{Rank: 2, Revision: 7, Time: time.Unix(2, 0)},
		}, []int{2, 5}},
		{"a victim of a reported peer comes after it", []rendezvous.Failure{
			{Rank: 5, Revision: 7, LostPeer: peer(2)},
			{Rank: 2, Revision: 9, Signal: "SIGKILL"},
		}, []int{2, 5}},
		{"a chain of victims", []rendezvous.Failure{
			{Rank: 5, Revision: 6, LostPeer: peer(4)},
			{Rank: 4, Revision: 7, LostPeer: peer(2)},
			{Rank: 2, Revision: 9},
		}, []int{2, 5, 4}},
		{"a peer that is not reported explains nothing", []rendezvous.Failure{
			{Rank: 5, Revision: 7, LostPeer: peer(3)},
			{Rank: 2, Revision: 9},
		}, []int{5, 2}},
		{"a lost node explains the ranks it held", []rendezvous.Failure{
			{Rank: 1, Revision: 5, LostPeer: peer(4)},
			{Rank: -1, Ranks: []int{4, 5}, Signal: "node lost", Revision: 12},
		}, []int{-1, 1}},
		{"earlier rounds first", []rendezvous.Failure{
			{Rank: 0, Attempt: 1, Revision: 20},
			{Rank: 3, Attempt: 0, Revision: 5, LostPeer: peer(0)},
		}, []int{3, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rendezvous.OrderFailures(tc.failures)
			var got []int
			for _, f := range tc.failures {
				got = append(got, f.Rank)
			}
			require.Equal(t, tc.want, got)
		})
	}
}

// A failure blamed before the kill it causes is first, whatever the
// clocks of the reports say, and a later full report keeps its place.
func TestBlameComesBeforeItsVictims(t *testing.T) {
	b := rdzvtest.NewBackend()
	a, bb := join(t, b, config("a", -1, testLimits)), join(t, b, config("b", -1, testLimits))
	ctx := context.Background()
	r := nextAll(t, a, bb)
	culprit := rendezvous.Failure{Host: "a", Rank: 1, ExitCode: 137, Signal: "SIGKILL", Time: time.Now().Add(time.Hour), Error: "hung"}
	require.NoError(t, a.rdzv.Blame(ctx, r[0], []rendezvous.Failure{culprit}))
	victim := rendezvous.Failure{Host: "b", Rank: 3, ExitCode: 1, Time: time.Now(), Error: "connection reset"}
	_, err := bb.rdzv.Failed(ctx, r[1], []rendezvous.Failure{victim})
	require.NoError(t, err)
	culprit.Error = "hung; and its stack"
	_, err = a.rdzv.Failed(ctx, r[0], []rendezvous.Failure{culprit})
	require.NoError(t, err)

	failures, err := a.rdzv.Failures(ctx)
	require.NoError(t, err)
	require.Len(t, failures, 2)
	require.Equal(t, 1, failures[0].Rank)
	require.Equal(t, "hung; and its stack", failures[0].Error)
}

// An agent that cannot go on ends the job for every node at once, and is
// the first failure.
func TestAbandonClosesTheJob(t *testing.T) {
	b := rdzvtest.NewBackend()
	a, bb := join(t, b, config("a", -1, testLimits)), join(t, b, config("b", -1, testLimits))
	ctx := context.Background()
	r := nextAll(t, a, bb)
	ends := bb.rdzv.Watch(ctx, r[1])
	require.NoError(t, a.rdzv.Abandon(ctx, rendezvous.Failure{ExitCode: 1, Time: time.Now(), Error: "pick MASTER_PORT: no such host"}))
	end := <-ends
	require.True(t, end.Closed)
	require.Equal(t, rendezvous.ResultFailed, end.Result)
	require.Contains(t, end.Reason, "the agent on a failed")
	failures, err := bb.rdzv.Failures(ctx)
	require.NoError(t, err)
	require.Len(t, failures, 1)
	require.True(t, failures[0].Agent)
	require.Contains(t, failures[0].String(), "the agent on a failed at")
	require.Contains(t, failures[0].String(), "no such host")
}

// When every node's workers stall with no culprit anywhere, exactly one
// node (the first to say so) names one; a node with a culprit ends the
// round for the others.
func TestStalledNamesOneNode(t *testing.T) {
	b := rdzvtest.NewBackend()
	a, bb := join(t, b, config("a", -1, testLimits)), join(t, b, config("b", -1, testLimits))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := nextAll(t, a, bb)
	first := make(chan bool, 1)
	go func() {
		blame, err := bb.rdzv.Stalled(ctx, r[1])
		first <- err == nil && blame
	}()
	require.Eventually(t, func() bool {
		_, ok := b.Value("rounds/00000000/stall/b-id")
		return ok
	}, 5*time.Second, time.Millisecond, "b reports its stall first")
	blame, err := a.rdzv.Stalled(ctx, r[0])
	require.NoError(t, err)
	require.False(t, blame)
	require.True(t, <-first)

	// Round 1: a names a culprit and ends the round; b's stall is moot.
	_, err = bb.rdzv.Failed(ctx, r[1], []rendezvous.Failure{{Host: "b", Rank: 2, ExitCode: 137}})
	require.NoError(t, err)
	r = nextAll(t, a, bb)
	failed := make(chan error, 1)
	go func() {
		_, err := a.rdzv.Failed(ctx, r[0], []rendezvous.Failure{{Host: "a", Rank: 0, ExitCode: 137}})
		failed <- err
	}()
	blame, err = bb.rdzv.Stalled(ctx, r[1])
	require.NoError(t, err)
	require.False(t, blame)
	require.NoError(t, <-failed)
}

// A world that broke with no node lost re-forms: Reform opens the next
// round as a membership change of the same members (the in-place path),
// charged to the membership budget, and a second Reform of the same
// round, from another node, does nothing.
func TestReformOpensARoundOfTheSameMembers(t *testing.T) {
	b := rdzvtest.NewBackend()
	a, bb := join(t, b, config("a", -1, testLimits)), join(t, b, config("b", -1, testLimits))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := nextAll(t, a, bb)
	ends := bb.rdzv.Watch(ctx, r[1])
	require.NoError(t, a.rdzv.Reform(ctx, r[0], "ranks [0] on a lost a peer"))
	end := <-ends
	require.False(t, end.Closed)
	require.Equal(t, rendezvous.CauseMembership, end.Cause)
	require.Contains(t, end.Reason, "lost a peer")
	require.Empty(t, end.Lost, "nobody is lost")
	require.NoError(t, bb.rdzv.Reform(ctx, r[1], "the same fault seen from b"), "the job moved on: nothing to do")

	next := nextAll(t, a, bb)
	require.Equal(t, r[0].Number+1, next[0].Number, "one round, not two")
	require.Equal(t, r[0].WorldSize, next[0].WorldSize)
	require.Equal(t, r[0].NodeRank, next[0].NodeRank)
	require.Equal(t, r[1].NodeRank, next[1].NodeRank)

	var static rendezvous.Static
	require.ErrorIs(t, static.Reform(ctx, r[0], "x"), rendezvous.ErrNoReform)
}
