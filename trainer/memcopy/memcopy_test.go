package memcopy

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/trainer/comm"
	"github.com/gorun/gorun/trainer/internal/worldtest"
	"github.com/gorun/gorun/trainer/recovery"
)

// An idle kernels team lets go of its goroutines within ~20 ms by itself (tested in kernels);
// goleak need not wait for them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/gorun/gorun/trainer/kernels.(*team).work"))
}

// job is an in-process job: one comm.World per rank over loopback, and a
// Keeper on each.
type job struct {
	worlds  []*comm.World
	keepers []*Keeper
}

// start connects size ranks, perNode per node, and makes their Keepers
// (one replica).
func start(t testing.TB, size, perNode int, tcpOnly bool) *job {
	return startReplicas(t, size, perNode, 1, tcpOnly)
}

// startReplicas is start with Keepers of replicas copies.
func startReplicas(t testing.TB, size, perNode, replicas int, tcpOnly bool) *job {
	t.Helper()
	j := &job{worlds: worldtest.Start(t, worldtest.New(t, "memcopy-test", size, perNode), func(w distenv.Worker) (*comm.World, error) {
		cfg := comm.ConfigFrom(w, jobsecret.Secret{})
		cfg.Timeout, cfg.TCPOnly = 10*time.Second, tcpOnly
		return comm.Connect(context.Background(), cfg)
	})}
	j.keepers = make([]*Keeper, size)
	testutil.RequireRanks(t, testutil.OnRanks(size, func(r int) error {
		var err error
		j.keepers[r], err = New(j.worlds[r], perNode, replicas)
		return err
	}))
	t.Cleanup(func() { // before worldtest's, which then finds the worlds closed
		for r := range j.worlds {
			require.NoError(t, j.worlds[r].Close()) // first: ends any exchange at once
			require.NoError(t, j.keepers[r].Close())
		}
	})
	return j
}

// shard is rank r's state of n elements after step: values that name
// rank, step, array and element.
func shard(r int, step int64, n int) recovery.Slice {
	c := recovery.Make(step, r*n, (r+1)*n)
	for i := range n {
		base := float32(step)*1e6 + float32(r)*1e5 + float32(i%1000)
		c.Params[i], c.M[i], c.V[i] = base, base+0.25, base+0.5
	}
	return c
}

// snapshotAll snapshots step on the ranks given (nil: all) and waits for
// their exchanges.
func (j *job) snapshotAll(t *testing.T, step int64, n int) {
	t.Helper()
	for r, k := range j.keepers {
		require.NoError(t, k.Snapshot(shard(r, step, n)), "rank %d", r)
	}
	for r, k := range j.keepers {
		require.NoError(t, k.Wait(), "rank %d", r)
	}
}

// steps lists the steps of the pairs in copies, newest first, and checks
// that each is a pair: this rank's own shard, then from's.
func requirePairs(t *testing.T, rank, from, n int, copies []recovery.Slice) []int64 {
	t.Helper()
	require.Zero(t, len(copies)%2, "rank %d: pairs", rank)
	var steps []int64
	for i := 0; i < len(copies); i += 2 {
		own, held := copies[i], copies[i+1]
		require.Equal(t, own.Step, held.Step, "rank %d: a pair of one step", rank)
		require.Equal(t, shard(rank, own.Step, n), own, "rank %d: own snapshot of step %d", rank, own.Step)
		require.Equal(t, shard(from, held.Step, n), held, "rank %d: copy of rank %d, step %d", rank, from, held.Step)
		steps = append(steps, own.Step)
	}
	return steps
}

// TestTwoReplicas: 4 nodes x 1 rank, two replicas: each rank holds the
// shards of the two ranks before it, of the same step, so any two nodes
// lost at once (here the adjacent ranks 1 and 2) leave every shard on a
// survivor. More replicas than other nodes are capped.
func TestTwoReplicas(t *testing.T) {
	const size, n = 4, 1000
	j := startReplicas(t, size, 1, 2, false)
	for step := int64(1); step <= 2; step++ {
		j.snapshotAll(t, step, n)
	}
	for r, k := range j.keepers {
		require.Equal(t, 2, k.Replicas())
		copies := k.Copies()
		require.Len(t, copies, 3, "rank %d: own and two held copies of step 2", r)
		require.Equal(t, shard(r, 2, n), copies[0], "rank %d: own", r)
		require.Equal(t, shard((r-1+size)%size, 2, n), copies[1], "rank %d: the previous node's", r)
		require.Equal(t, shard((r-2+size)%size, 2, n), copies[2], "rank %d: the one before", r)
	}
	held := map[int]bool{}
	for _, r := range []int{0, 3} { // the survivors of nodes 1 and 2
		for _, c := range j.keepers[r].Copies() {
			held[c.Lo/n] = true
		}
	}
	require.Len(t, held, size, "every shard survives two adjacent nodes lost")

	capped := startReplicas(t, 2, 1, 5, false)
	require.Equal(t, 1, capped.keepers[0].Replicas(), "one other node: one replica")
}

// TestNodeLoss: 3 nodes x 2 ranks snapshot three steps, then node 2's ranks
// (4 and 5) vanish: before the next step, or in the middle of its
// exchange. Each survivor keeps complete pairs, and some step is held by
// every survivor, with node 0's ranks holding the copies of ranks 4 and 5
// of that step: the lost shards are recoverable from memory.
func TestNodeLoss(t *testing.T) {
	const size, perNode, n = 6, 2, 50_000 // 600 kB of state a rank: two chunks of the comm rings
	for _, tc := range []struct {
		name     string
		midSend  bool    // node 2 starts the exchange of step 4 before it vanishes
		possible []int64 // steps the common one may be
	}{
		{"between steps", false, []int64{3}},
		{"mid exchange", true, []int64{3, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := start(t, size, perNode, false)
			require.Equal(t, []int{2, 4}, []int{j.keepers[0].Buddy(), j.keepers[0].From()})
			require.Equal(t, []int{0, 2}, []int{j.keepers[4].Buddy(), j.keepers[4].From()})
			for step := int64(1); step <= 3; step++ {
				j.snapshotAll(t, step, n)
			}
			for r := range 4 {
				require.NoError(t, j.keepers[r].Snapshot(shard(r, 4, n)), "rank %d", r)
			}
			for r := 4; r < size; r++ {
				if tc.midSend {
					require.NoError(t, j.keepers[r].Snapshot(shard(r, 4, n)), "rank %d", r)
				}
				require.NoError(t, j.worlds[r].Close())
				require.NoError(t, j.keepers[r].Close())
			}
			held := map[int64]int{} // step -> survivors holding a pair of it
			for r := range 4 {
				err := j.keepers[r].Wait()
				if !tc.midSend {
					var pe *comm.PeerError
					require.ErrorAs(t, err, &pe, "rank %d", r)
				}
				from := (r - perNode + size) % size
				for _, s := range requirePairs(t, r, from, n, j.keepers[r].Copies()) {
					held[s]++
				}
				if err != nil {
					require.ErrorContains(t, j.keepers[r].Snapshot(shard(r, 5, n)), "exchange of step 4", "rank %d: broken for good", r)
				}
			}
			common := int64(-1)
			for s, holders := range held {
				if holders == 4 {
					common = max(common, s)
				}
			}
			require.Contains(t, tc.possible, common, "held: %v", held)
			for r := range perNode { // node 0 holds node 2's shards
				i := slices.IndexFunc(j.keepers[r].Copies(), func(c recovery.Slice) bool { return c.Step == common && c.Lo == (r+4)*n })
				require.GreaterOrEqual(t, i, 0, "rank %d holds rank %d's shard of step %d", r, r+4, common)
			}
		})
	}
}

// TestSnapshotReturnsBeforeTheTransfer: ranks 0 and 1 of a 2x2 job
// snapshot and get control back before their buddies (2 and 3) have even
// started: their transfer cannot have ended (it needs the buddies), and
// they hold nothing complete yet. Once the buddies snapshot, every rank's
// exchange ends with a complete pair.
func TestSnapshotReturnsBeforeTheTransfer(t *testing.T) {
	const n = 1000
	j := start(t, 4, 2, false)
	for r := range 2 {
		require.NoError(t, j.keepers[r].Snapshot(shard(r, 1, n)))
		require.Empty(t, j.keepers[r].Copies(), "rank %d: nothing complete before its buddy took part", r)
	}
	for r := 2; r < 4; r++ {
		require.NoError(t, j.keepers[r].Snapshot(shard(r, 1, n)))
	}
	for r, k := range j.keepers {
		require.NoError(t, k.Wait(), "rank %d", r)
		require.Equal(t, []int64{1}, requirePairs(t, r, (r+2)%4, n, k.Copies()))
	}
	// The snapshot is the Keeper's own: changing the caller's data after
	// Snapshot returned changes no copy.
	c := shard(0, 2, n)
	require.NoError(t, j.keepers[0].Snapshot(c))
	c.Params[0] = -1
	for r := 1; r < 4; r++ {
		require.NoError(t, j.keepers[r].Snapshot(shard(r, 2, n)))
	}
	for r, k := range j.keepers {
		require.NoError(t, k.Wait(), "rank %d", r)
		require.Equal(t, []int64{2}, requirePairs(t, r, (r+2)%4, n, k.Copies()))
	}
}

// TestRejected: a copy that fails its checksum, or is of another step, is
// rejected by every rank of the world alike (the ring of local rank 1 had
// no trouble, and rejects it too, so that no step is complete on one ring
// and not on the other): they keep the previous step's pair, Snapshot
// returns ErrRejected once and starts nothing, and the next one goes on.
func TestRejected(t *testing.T) {
	const n = 5000
	for _, tc := range []struct {
		name string
		edit func(j *job, c *recovery.Slice) // on rank 2's snapshot of step 2
		want string
	}{
		{"checksum", func(j *job, _ *recovery.Slice) { j.keepers[2].tamper = func(b []byte) { b[len(b)/2] ^= 1 } },
			"memcopy: step 2: memcopy: a copy was rejected: the copy rank 2 received from rank 0 failed its crc32c check"},
		{"other step", func(_ *job, c *recovery.Slice) { c.Step = 7 },
			"the copy rank 0 received from rank 2 is of another step; the copy rank 2 received from rank 0 is of another step"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := start(t, 4, 2, true)
			j.snapshotAll(t, 1, n)
			for r, k := range j.keepers {
				c := shard(r, 2, n)
				if r == 2 {
					tc.edit(j, &c)
				}
				require.NoError(t, k.Snapshot(c))
			}
			for r, k := range j.keepers {
				err := k.Wait()
				require.ErrorIs(t, err, ErrRejected, "rank %d", r)
				require.ErrorContains(t, err, tc.want, "rank %d", r)
				require.Equal(t, []int64{1}, requirePairs(t, r, (r+2)%4, n, k.Copies()), "rank %d keeps step 1", r)
			}
			j.keepers[2].tamper = nil
			for r, k := range j.keepers {
				require.ErrorIs(t, k.Snapshot(shard(r, 9, n)), ErrRejected, "rank %d: reported once, nothing started", r)
				require.NoError(t, k.Wait())
			}
			j.snapshotAll(t, 9, n)
			for r, k := range j.keepers {
				require.Equal(t, []int64{9}, requirePairs(t, r, (r+2)%4, n, k.Copies()))
			}
		})
	}
}

// TestOneNode: with every rank on one node there is no buddy: each Keeper
// keeps only its own newest snapshot.
func TestOneNode(t *testing.T) {
	j := start(t, 2, 2, false)
	for r, k := range j.keepers {
		require.Equal(t, []int{-1, -1}, []int{k.Buddy(), k.From()})
		require.NoError(t, k.Snapshot(shard(r, 1, 10)))
		require.NoError(t, k.Snapshot(shard(r, 2, 10)))
		require.NoError(t, k.Wait())
		require.Equal(t, []recovery.Slice{shard(r, 2, 10)}, k.Copies())
	}
}

// TestBadInput: input Snapshot and New refuse, with what was wrong; and a
// closed Keeper refuses snapshots but keeps its copies.
func TestBadInput(t *testing.T) {
	j := start(t, 4, 2, false)
	short := shard(0, 2, 10)
	short.V = short.V[:9]
	for _, tc := range []struct {
		name string
		c    recovery.Slice
		want string
	}{
		{"lengths", short, "elements [0, 10) but 10 params, 10 m, 9 v"},
		{"hi below lo", recovery.Slice{Step: 2, Lo: 5, Hi: 4}, "want 0 <= lo <= hi"},
		{"negative lo", recovery.Slice{Step: 2, Lo: -1, Hi: 0}, "want 0 <= lo <= hi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorContains(t, j.keepers[0].Snapshot(tc.c), tc.want)
		})
	}
	j.snapshotAll(t, 1, 10)
	require.ErrorContains(t, j.keepers[0].Snapshot(shard(0, 1, 10)), "not after step 1")

	_, err := New(j.worlds[0], 3, 1)
	require.ErrorContains(t, err, "local world size 3 does not divide world size 4")
	_, err = New(j.worlds[0], 2, 0)
	require.ErrorContains(t, err, "0 replicas")

	before := j.keepers[1].Copies()
	require.NoError(t, j.keepers[1].Close())
	require.NoError(t, j.keepers[1].Close())
	require.True(t, errors.Is(j.keepers[1].Snapshot(shard(1, 2, 10)), ErrClosed))
	require.Equal(t, before, j.keepers[1].Copies())
}
