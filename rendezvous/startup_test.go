package rendezvous_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// An agent that fails before the others arrive (here: it cannot offer a
// MASTER_PORT on its address) records its failure in its launch's
// incarnation; an agent of the same launch that arrives after it joins
// that incarnation and learns at once that the job failed, and why,
// instead of starting a new incarnation and waiting join_timeout.
func TestStartupFailureFailsTheLateAgentsOfTheLaunch(t *testing.T) {
	eps := etcdtest.Start(t).Endpoints()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	launch := etcdstore.Launch{Generation: 0, Step: "0", Identified: true}
	lim := rendezvous.Limits{MinNodes: 2, MaxNodes: 2}
	enter := func(host string, freePort func(string) (int, error)) (*rendezvous.Elastic, etcdstore.Entry) {
		client := etcdtest.NewClient(t, eps...)
		entry, err := etcdstore.NewConn(client).Enter(ctx, "startup", launch)
		require.NoError(t, err)
		store, err := etcdstore.NewConn(client).NewStore(ctx, entry.Incarnation, testTTL)
		require.NoError(t, err)
		cfg := config(host, -1, lim)
		cfg.JoinTimeout = time.Minute // far longer than the test may take
		if freePort != nil {
			cfg.FreePort = freePort
		}
		e, err := rendezvous.Join(ctx, store, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.Close() })
		return e, entry
	}
	a, first := enter("a", func(string) (int, error) { return 0, errors.New("lookup a: no such host") })
	_, err := a.Next(ctx)
	require.ErrorContains(t, err, "no such host")
	require.NoError(t, a.Abandon(ctx, rendezvous.Failure{ExitCode: 1, Time: time.Now(), Error: err.Error()}))
	require.NoError(t, a.Close())

	b, second := enter("b", nil)
	require.Equal(t, first.Incarnation, second.Incarnation, "one launch, one incarnation")
	_, err = b.Next(ctx)
	var closed *rendezvous.ClosedError
	require.ErrorAs(t, err, &closed)
	require.Equal(t, rendezvous.ResultFailed, closed.Result)
	require.Contains(t, closed.Reason, "the agent on a failed")
	require.Contains(t, closed.Reason, "no such host")
	failures, err := b.Failures(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, failures)
	require.True(t, failures[0].Agent)
	require.Equal(t, "a", failures[0].Host)
}
