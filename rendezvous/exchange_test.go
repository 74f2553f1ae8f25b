package rendezvous_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/rdzvtest"
)

// exchangeAll runs Exchange on each node (value: its host) at once and
// returns what each got.
func exchangeAll(t *testing.T, rounds []rendezvous.Round, nodes ...*node) ([][][]byte, []error) {
	t.Helper()
	got := make([][][]byte, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			got[i], errs[i] = n.rdzv.Exchange(ctx, rounds[i], []byte(n.host))
		})
	}
	wg.Wait()
	return got, errs
}

// Every node of a round gets every node's value, in node-rank order, and
// the next round's exchange is its own (the last one's values are not
// taken for it).
func TestExchange(t *testing.T) {
	b := rdzvtest.NewBackend()
	nodes := []*node{join(t, b, config("a", 2, testLimits)), join(t, b, config("b", 0, testLimits)), join(t, b, config("c", 1, testLimits))}
	rounds := nextAll(t, nodes...)
	byRank := make([][]byte, 3)
	for i, r := range rounds {
		byRank[r.NodeRank] = []byte(nodes[i].host)
	}
	got, errs := exchangeAll(t, rounds, nodes...)
	require.NoError(t, errors.Join(errs...))
	for i := range nodes {
		require.Equal(t, byRank, got[i], "node %s", nodes[i].host)
	}

	// A failure opens round 1; its exchange waits for its own values.
	_, err := nodes[0].rdzv.Failed(context.Background(), rounds[0], []rendezvous.Failure{{Host: "a", Rank: 0, ExitCode: 1, Time: time.Now()}})
	require.NoError(t, err)
	second := nextAll(t, nodes...)
	for i := range nodes {
		nodes[i].host += "2"
		byRank[second[i].NodeRank] = []byte(nodes[i].host)
	}
	got, errs = exchangeAll(t, second, nodes...)
	require.NoError(t, errors.Join(errs...))
	require.Equal(t, byRank, got[0])
	_, present := b.Value(fmt.Sprintf("rounds/%08d/exchange/a-id", rounds[0].Number))
	require.False(t, present, "a node's part of the round before is deleted")
}

// An exchange that a node of the round never joins ends when the round
// ends (the node's lease expired), with ErrRoundEnded saying how many took
// part; one whose context ends returns its cause.
func TestExchangeEndsWithTheRound(t *testing.T) {
	b := rdzvtest.NewBackend()
	nodes := []*node{join(t, b, config("a", -1, testLimits)), join(t, b, config("b", -1, testLimits)), join(t, b, config("c", -1, testLimits))}
	rounds := nextAll(t, nodes...)
	done := make(chan error, 1)
	go func() {
		_, err := nodes[0].rdzv.Exchange(context.Background(), rounds[0], []byte("a"))
		done <- err
	}()
	nodes[2].store.Kill() // node c dies before it takes part
	err := <-done
	require.ErrorIs(t, err, rendezvous.ErrRoundEnded)
	require.ErrorContains(t, err, "1 of 3 did")

	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("stopped")
	cancel(stop)
	_, err = nodes[1].rdzv.Exchange(ctx, rounds[1], []byte("b"))
	require.ErrorIs(t, err, stop)
}

// A static launch exchanges with itself alone; several static nodes share
// no store, which is a clear error.
func TestStaticExchange(t *testing.T) {
	s := &rendezvous.Static{Round: rendezvous.Round{NumNodes: 1}}
	got, err := s.Exchange(context.Background(), s.Round, []byte("x"))
	require.NoError(t, err)
	require.Equal(t, [][]byte{[]byte("x")}, got)
	s.Round.NumNodes = 2
	_, err = s.Exchange(context.Background(), s.Round, []byte("x"))
	require.ErrorIs(t, err, rendezvous.ErrNoExchange)
	require.ErrorContains(t, err, "--rdzv-backend=etcd")
}
