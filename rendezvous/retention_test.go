package rendezvous_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
	"github.com/gorun/gorun/rendezvous/rdzvtest"
)

// enterEtcd enters run runID as a new agent would, registers it in the
// incarnation it got, and returns both.
func enterEtcd(t *testing.T, endpoints []string, runID string, cfg rendezvous.Config) (*etcdNode, etcdstore.Entry) {
	t.Helper()
	client := etcdtest.NewClient(t, endpoints...)
	entry, err := etcdstore.NewConn(client).Enter(context.Background(), runID, etcdstore.Launch{})
	require.NoError(t, err)
	store, err := etcdstore.NewConn(client).NewStore(context.Background(), entry.Incarnation, testTTL)
	require.NoError(t, err)
	e, err := rendezvous.Join(context.Background(), store, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return &etcdNode{node: node{rdzv: e, host: cfg.Self.Host}, client: client}, entry
}

// A job that ran to its end over the protocol: its keys get the retention
// lease, status still reads it, and the same run id runs again as
// incarnation 1 with fresh counters.
func TestFinishedRunIsKeptThenReplaced(t *testing.T) {
	for _, srv := range etcdtest.Kinds() {
		t.Run(srv.Name, func(t *testing.T) { testFinishedRunIsKeptThenReplaced(t, srv.Start(t).Endpoints()) })
	}
}

func testFinishedRunIsKeptThenReplaced(t *testing.T, eps []string) {
	client := etcdtest.NewClient(t, eps...)
	ctx := context.Background()
	lim := rendezvous.Limits{MinNodes: 2, MaxNodes: 2, MaxFailures: 1, MaxChanges: 1}
	a, entry := enterEtcd(t, eps, "again", config("a", -1, lim))
	b, _ := enterEtcd(t, eps, "again", config("b", -1, lim))
	rounds := nextAllEtcd(t, a, b)
	end, err := a.rdzv.Failed(ctx, rounds[0], []rendezvous.Failure{{Host: "a", Rank: 1, ExitCode: 3, Time: time.Now()}})
	require.NoError(t, err)
	require.False(t, end.Closed)
	rounds = nextAllEtcd(t, a, b)
	var wg sync.WaitGroup
	for i, n := range []*etcdNode{a, b} {
		wg.Go(func() {
			end, err := n.rdzv.Succeeded(ctx, rounds[i])
			require.NoError(t, err)
			require.True(t, end.Closed)
		})
	}
	wg.Wait()

	requireRetained := func(key string) {
		t.Helper()
		resp, err := client.Get(ctx, key)
		require.NoError(t, err)
		require.Len(t, resp.Kvs, 1, key)
		require.NotZero(t, resp.Kvs[0].Lease, "%s has a lease", key)
		ttl, err := client.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
		require.NoError(t, err)
		require.Greater(t, time.Duration(ttl.TTL)*time.Second, etcdstore.RetentionTTL-time.Minute, key)
	}
	// The aggregator attaches the state as soon as it closed the job (the
	// agents may see it closed a moment before); the last agent to leave
	// attaches what came later too.
	require.Eventually(t, func() bool {
		resp, err := client.Get(ctx, entry.Prefix()+"state")
		return err == nil && len(resp.Kvs) == 1 && resp.Kvs[0].Lease != 0
	}, 10*time.Second, 10*time.Millisecond, "the closed job's state gets the retention lease")
	requireRetained(entry.Prefix() + "state")
	require.NoError(t, a.rdzv.Close())
	require.NoError(t, b.rdzv.Close())
	require.NoError(t, etcdstore.NewConn(client).RetainIfDeserted(ctx, entry.Incarnation))
	requireRetained(entry.Prefix() + "failures/00000000/1-00000001")
	requireRetained(etcdstore.JobPrefix("again") + "current")

	status, err := etcdstore.NewConn(client).ReadStatus(ctx, "again")
	require.NoError(t, err)
	require.True(t, status.Exists)
	require.Equal(t, rendezvous.PhaseClosed, status.State.Phase)
	require.Equal(t, rendezvous.ResultSucceeded, status.State.Result)
	require.Len(t, status.Failures, 1)

	c, second := enterEtcd(t, eps, "again", config("c", -1, lim))
	d, _ := enterEtcd(t, eps, "again", config("d", -1, lim))
	require.Equal(t, "run again finished before (incarnation 0, succeeded): starting incarnation 1", second.String())
	rounds = nextAllEtcd(t, c, d)
	require.Equal(t, 0, rounds[0].Number, "a new incarnation starts at round 0")
	status, err = etcdstore.NewConn(client).ReadStatus(ctx, "again")
	require.NoError(t, err)
	require.Equal(t, 1, status.Incarnation)
	require.Equal(t, rendezvous.PhaseRunning, status.State.Phase)
	require.Zero(t, status.State.Failures)
	require.Empty(t, status.Failures)
	current, err := client.Get(ctx, etcdstore.JobPrefix("again")+"current")
	require.NoError(t, err)
	require.Zero(t, current.Kvs[0].Lease, "the pointer of a live run has no retention lease")
}

// A run still going keeps its keys: retention only takes a deserted one.
func TestRetainIfDesertedLeavesALiveRunAlone(t *testing.T) {
	eps := etcdtest.Start(t).Endpoints()
	client := etcdtest.NewClient(t, eps...)
	ctx := context.Background()
	a, entry := enterEtcd(t, eps, "live", config("a", -1, rendezvous.Limits{MinNodes: 1, MaxNodes: 1}))
	nextAllEtcd(t, a)
	require.NoError(t, etcdstore.NewConn(client).RetainIfDeserted(ctx, entry.Incarnation))
	resp, err := client.Get(ctx, entry.Prefix()+"state")
	require.NoError(t, err)
	require.Zero(t, resp.Kvs[0].Lease)
}

// The node whose compare-and-swap closes the job asks the store to keep
// the job's keys, once.
func TestClosingTheJobRetainsItsKeys(t *testing.T) {
	b := rdzvtest.NewBackend()
	nodes := []*node{join(t, b, config("a", -1, testLimits)), join(t, b, config("b", -1, testLimits))}
	rounds := nextAll(t, nodes...)
	require.Zero(t, b.Retains())
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			_, err := n.rdzv.Succeeded(context.Background(), rounds[i])
			require.NoError(t, err)
		})
	}
	wg.Wait()
	// The agent that closed the job retains its keys from its aggregator,
	// which may still be at it when every Succeeded returned: Close waits
	// for it.
	for _, n := range nodes {
		require.NoError(t, n.rdzv.Close())
	}
	require.Equal(t, 1, b.Retains())
}

// The agents leave as soon as they see the job closed, the aggregator
// among them: its Close must not cut short the retention it started when
// it closed the job (it did, with "context canceled", in most runs).
func TestLeavingAtOnceAfterTheCloseKeepsTheKeys(t *testing.T) {
	eps := etcdtest.Start(t).Endpoints()
	client := etcdtest.NewClient(t, eps...)
	ctx := context.Background()
	lim := rendezvous.Limits{MinNodes: 2, MaxNodes: 2}
	a, entry := enterEtcd(t, eps, "leave", config("a", -1, lim))
	b, _ := enterEtcd(t, eps, "leave", config("b", -1, lim))
	rounds := nextAllEtcd(t, a, b)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, n := range []*etcdNode{a, b} {
		wg.Go(func() {
			end, err := n.rdzv.Succeeded(ctx, rounds[i])
			if err == nil && !end.Closed {
				err = fmt.Errorf("%s: round ended without closing the job: %+v", n.host, end)
			}
			errs[i] = errors.Join(err, n.rdzv.Close())
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	resp, err := client.Get(ctx, entry.Prefix()+"state")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.NotZero(t, resp.Kvs[0].Lease, "the closed job's state has its retention lease once its agents left")
}
