package rendezvous_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/rdzvtest"
)

// enterEtcd enters run runID as a new agent would, registers it in the
// incarnation it got, and returns both.
func enterEtcd(t *testing.T, endpoints []string, runID string, cfg rendezvous.Config) (*etcdNode, rendezvous.Entry) {
	t.Helper()
	client := etcdtest.NewClient(t, endpoints...)
	entry, err := rendezvous.Enter(context.Background(), client, runID, 0)
	require.NoError(t, err)
	store, err := rendezvous.NewEtcdStore(context.Background(), client, entry.Incarnation, testTTL)
	require.NoError(t, err)
	e, err := rendezvous.Join(context.Background(), store, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return &etcdNode{node: node{rdzv: e, host: cfg.Self.Host}, client: client}, entry
}

// putState writes incarnation in's state key as its agents would.
func putState(t *testing.T, client *clientv3.Client, in rendezvous.Incarnation, st rendezvous.State) {
	t.Helper()
	data, err := json.Marshal(st)
	require.NoError(t, err)
	_, err = client.Put(context.Background(), in.Prefix()+"state", string(data))
	require.NoError(t, err)
}

// enterAll runs Enter for n agents of one launch at once (released
// together) and returns their entries.
func enterAll(t *testing.T, client *clientv3.Client, runID string, generation, n int) []rendezvous.Entry {
	t.Helper()
	entries := make([]rendezvous.Entry, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			entries[i], errs[i] = rendezvous.Enter(context.Background(), client, runID, generation)
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return entries
}

// Agents of one launch that start together land in one incarnation: the
// first run of a run id, then after each close, a new one that exactly
// one of them started. The compare-and-swap decides, not timing.
func TestAgentsEnteringTogetherShareOneIncarnation(t *testing.T) {
	srv := etcdtest.Start(t)
	client := srv.Client(t)
	const agents = 8
	for n := range 4 {
		entries := enterAll(t, client, "together", 0, agents)
		starters := 0
		for _, e := range entries {
			require.Equal(t, n, e.Number, "every agent in incarnation %d: %+v", n, entries)
			if e.Replaced != "" {
				starters++
				require.Equal(t, fmt.Sprintf("run together finished before (incarnation %d, failed): starting incarnation %d", n-1, n), e.String())
			}
		}
		if n == 0 {
			require.Zero(t, starters, "a fresh run id replaces nothing")
		} else {
			require.Equal(t, 1, starters, "one agent started incarnation %d", n)
		}
		in := entries[0].Incarnation
		putState(t, client, in, rendezvous.State{Round: 2, Phase: rendezvous.PhaseClosed, Result: rendezvous.ResultFailed})
		_, err := client.Put(context.Background(), in.Prefix()+"failures/00000002/00000001", "{}")
		require.NoError(t, err)
	}
	// Starting an incarnation deleted the previous one's keys.
	resp, err := client.Get(context.Background(), rendezvous.JobPrefix("together"), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	require.ElementsMatch(t, []string{"/gorun/together/current", "/gorun/together/3/state", "/gorun/together/3/failures/00000002/00000001"}, keys)
}

// What a new agent does with the run's current incarnation: join it while
// it is new or live; replace it when it closed, died or belongs to an
// earlier SLURM restart.
func TestEnterJoinsOrReplaces(t *testing.T) {
	for _, srv := range etcdServers {
		t.Run(srv.name, func(t *testing.T) { testEnterJoinsOrReplaces(t, srv.start(t).Endpoints()) })
	}
}

func testEnterJoinsOrReplaces(t *testing.T, eps []string) {
	client := etcdtest.NewClient(t, eps...)
	ctx := context.Background()
	entry, err := rendezvous.Enter(ctx, client, "job", 0)
	require.NoError(t, err)
	require.Equal(t, rendezvous.Entry{Incarnation: rendezvous.Incarnation{RunID: "job"}}, entry)
	in := entry.Incarnation

	// No round yet: agents of the launch are starting. Join.
	entry, err = rendezvous.Enter(ctx, client, "job", 0)
	require.NoError(t, err)
	require.Equal(t, 0, entry.Number)
	require.Empty(t, entry.Replaced)

	// A live run (state and a registered agent): join, a membership change.
	live, err := clientv3.NewLease(client).Grant(ctx, 60)
	require.NoError(t, err)
	_, err = client.Put(ctx, in.Prefix()+"nodes/a-id", "{}", clientv3.WithLease(live.ID))
	require.NoError(t, err)
	putState(t, client, in, rendezvous.State{Round: 1, Phase: rendezvous.PhaseRunning})
	entry, err = rendezvous.Enter(ctx, client, "job", 0)
	require.NoError(t, err)
	require.Equal(t, 0, entry.Number)
	require.Empty(t, entry.Replaced)

	// Its agents all died (their leases expired): a dead run is replaced.
	_, err = client.Revoke(ctx, live.ID)
	require.NoError(t, err)
	entry, err = rendezvous.Enter(ctx, client, "job", 0)
	require.NoError(t, err)
	require.Equal(t, "run job died before (incarnation 0: round 1 running, no agent alive): starting incarnation 1", entry.String())

	// A SLURM requeue replaces even a live-looking incarnation (the old
	// agents' leases may not have expired yet), and records its restart.
	live, err = clientv3.NewLease(client).Grant(ctx, 60)
	require.NoError(t, err)
	_, err = client.Put(ctx, entry.Prefix()+"nodes/a-id", "{}", clientv3.WithLease(live.ID))
	require.NoError(t, err)
	putState(t, client, entry.Incarnation, rendezvous.State{Phase: rendezvous.PhaseRunning})
	entry, err = rendezvous.Enter(ctx, client, "job", 2)
	require.NoError(t, err)
	require.Equal(t, rendezvous.Incarnation{RunID: "job", Number: 2, Generation: 2}, entry.Incarnation)
	require.Contains(t, entry.Replaced, "started by SLURM restart 0 and this is restart 2 (requeued")
	// An agent of that requeue starting later joins it.
	entry, err = rendezvous.Enter(ctx, client, "job", 2)
	require.NoError(t, err)
	require.Equal(t, 2, entry.Number)
	require.Empty(t, entry.Replaced)

	status, err := rendezvous.ReadStatus(ctx, client, "job")
	require.NoError(t, err)
	require.True(t, status.Started)
	require.Equal(t, 2, status.Incarnation)
	require.Equal(t, 2, status.Generation)
	require.False(t, status.Exists, "incarnation 2 has no round yet")

	status, err = rendezvous.ReadStatus(ctx, client, "never")
	require.NoError(t, err)
	require.False(t, status.Started)
}

// A job that ran to its end over the protocol: its keys get the retention
// lease, status still reads it, and the same run id runs again as
// incarnation 1 with fresh counters.
func TestFinishedRunIsKeptThenReplaced(t *testing.T) {
	for _, srv := range etcdServers {
		t.Run(srv.name, func(t *testing.T) { testFinishedRunIsKeptThenReplaced(t, srv.start(t).Endpoints()) })
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
		require.Greater(t, time.Duration(ttl.TTL)*time.Second, rendezvous.RetentionTTL-time.Minute, key)
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
	require.NoError(t, rendezvous.RetainIfDeserted(ctx, client, entry.Incarnation))
	requireRetained(entry.Prefix() + "failures/00000000/00000001")
	requireRetained(rendezvous.JobPrefix("again") + "current")

	status, err := rendezvous.ReadStatus(ctx, client, "again")
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
	status, err = rendezvous.ReadStatus(ctx, client, "again")
	require.NoError(t, err)
	require.Equal(t, 1, status.Incarnation)
	require.Equal(t, rendezvous.PhaseRunning, status.State.Phase)
	require.Zero(t, status.State.Failures)
	require.Empty(t, status.Failures)
	current, err := client.Get(ctx, rendezvous.JobPrefix("again")+"current")
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
	require.NoError(t, rendezvous.RetainIfDeserted(ctx, client, entry.Incarnation))
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
	require.Equal(t, 1, b.Retains())
}
