package etcdstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// putState writes incarnation in's state key as its agents would.
func putState(t *testing.T, client *clientv3.Client, in etcdstore.Incarnation, st rendezvous.State) {
	t.Helper()
	data, err := json.Marshal(st)
	require.NoError(t, err)
	_, err = client.Put(context.Background(), in.Prefix()+"state", string(data))
	require.NoError(t, err)
}

// enterAll runs Enter for n agents of one launch at once (released
// together) and returns their entries.
func enterAll(t *testing.T, client *clientv3.Client, runID string, generation, n int) []etcdstore.Entry {
	t.Helper()
	entries := make([]etcdstore.Entry, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			entries[i], errs[i] = etcdstore.NewConn(client).Enter(context.Background(), runID, etcdstore.Launch{Generation: generation})
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
	resp, err := client.Get(context.Background(), etcdstore.JobPrefix("together"), clientv3.WithPrefix(), clientv3.WithKeysOnly())
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
	for _, srv := range etcdtest.Kinds() {
		t.Run(srv.Name, func(t *testing.T) { testEnterJoinsOrReplaces(t, srv.Start(t).Endpoints()) })
	}
}

func testEnterJoinsOrReplaces(t *testing.T, eps []string) {
	client := etcdtest.NewClient(t, eps...)
	ctx := context.Background()
	entry, err := etcdstore.NewConn(client).Enter(ctx, "job", etcdstore.Launch{})
	require.NoError(t, err)
	require.Equal(t, etcdstore.Entry{Incarnation: etcdstore.Incarnation{RunID: "job"}}, entry)
	in := entry.Incarnation

	// No round yet: agents of the launch are starting. Join.
	entry, err = etcdstore.NewConn(client).Enter(ctx, "job", etcdstore.Launch{})
	require.NoError(t, err)
	require.Equal(t, 0, entry.Number)
	require.Empty(t, entry.Replaced)

	// A live run (state and a registered agent): join, a membership change.
	live, err := clientv3.NewLease(client).Grant(ctx, 60)
	require.NoError(t, err)
	_, err = client.Put(ctx, in.Prefix()+"nodes/a-id", "{}", clientv3.WithLease(live.ID))
	require.NoError(t, err)
	putState(t, client, in, rendezvous.State{Round: 1, Phase: rendezvous.PhaseRunning})
	entry, err = etcdstore.NewConn(client).Enter(ctx, "job", etcdstore.Launch{})
	require.NoError(t, err)
	require.Equal(t, 0, entry.Number)
	require.Empty(t, entry.Replaced)

	// Its agents all died (their leases expired): a dead run is replaced.
	_, err = client.Revoke(ctx, live.ID)
	require.NoError(t, err)
	entry, err = etcdstore.NewConn(client).Enter(ctx, "job", etcdstore.Launch{})
	require.NoError(t, err)
	require.Equal(t, "run job died before (incarnation 0: round 1 running, no agent alive): starting incarnation 1", entry.String())

	// A SLURM requeue replaces even a live-looking incarnation (the old
	// agents' leases may not have expired yet), and records its restart.
	live, err = clientv3.NewLease(client).Grant(ctx, 60)
	require.NoError(t, err)
	_, err = client.Put(ctx, entry.Prefix()+"nodes/a-id", "{}", clientv3.WithLease(live.ID))
	require.NoError(t, err)
	putState(t, client, entry.Incarnation, rendezvous.State{Phase: rendezvous.PhaseRunning})
	entry, err = etcdstore.NewConn(client).Enter(ctx, "job", etcdstore.Launch{Generation: 2})
	require.NoError(t, err)
	require.Equal(t, etcdstore.Incarnation{RunID: "job", Number: 2, Generation: 2}, entry.Incarnation)
	require.Contains(t, entry.Replaced, "started by SLURM restart 0 and this is restart 2 (requeued")
	// An agent of that requeue starting later joins it.
	entry, err = etcdstore.NewConn(client).Enter(ctx, "job", etcdstore.Launch{Generation: 2})
	require.NoError(t, err)
	require.Equal(t, 2, entry.Number)
	require.Empty(t, entry.Replaced)

	status, err := etcdstore.NewConn(client).ReadStatus(ctx, "job")
	require.NoError(t, err)
	require.True(t, status.Started)
	require.Equal(t, 2, status.Incarnation)
	require.Equal(t, 2, status.Generation)
	require.False(t, status.Exists, "incarnation 2 has no round yet")

	status, err = etcdstore.NewConn(client).ReadStatus(ctx, "never")
	require.NoError(t, err)
	require.False(t, status.Started)
}

// One launch is one incarnation: an agent of an identified launch joins
// the incarnation its launch started even when it closed or died, while
// another step of the job, or a launch that cannot be told apart, starts
// a new one.
func TestIdentifiedLaunchJoinsItsOwnIncarnation(t *testing.T) {
	client := etcdtest.Start(t).Client(t)
	ctx := context.Background()
	step0 := etcdstore.Launch{Generation: 1, Step: "0", Identified: true}
	entry, err := etcdstore.NewConn(client).Enter(ctx, "job", step0)
	require.NoError(t, err)
	require.Equal(t, etcdstore.Incarnation{RunID: "job", Generation: 1, Step: "0", Identified: true}, entry.Incarnation)
	putState(t, client, entry.Incarnation, rendezvous.State{Phase: rendezvous.PhaseClosed, Result: rendezvous.ResultFailed})

	late, err := etcdstore.NewConn(client).Enter(ctx, "job", step0)
	require.NoError(t, err)
	require.Equal(t, entry, late, "a late agent of the launch joins its closed incarnation")
	next, err := etcdstore.NewConn(client).Enter(ctx, "job", etcdstore.Launch{Generation: 1, Step: "1", Identified: true})
	require.NoError(t, err)
	require.Equal(t, "run job finished before (incarnation 0, failed): starting incarnation 1", next.String())

	// Dead (a state, no agent registered): still the launch's own.
	putState(t, client, next.Incarnation, rendezvous.State{Phase: rendezvous.PhaseJoinable})
	got, err := etcdstore.NewConn(client).Enter(ctx, "job", etcdstore.Launch{Generation: 1, Step: "1", Identified: true})
	require.NoError(t, err)
	require.Equal(t, next.Incarnation, got.Incarnation)
	require.Empty(t, got.Replaced)

	// Not identified: a re-run of the run id replaces it.
	got, err = etcdstore.NewConn(client).Enter(ctx, "job", etcdstore.Launch{Generation: 1})
	require.NoError(t, err)
	require.Equal(t, 2, got.Number)
	require.Contains(t, got.Replaced, "died before")
}
