package comm

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/trainer/internal/worldtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	goleak.VerifyTestMain(m)
}

func testConfig(port, rank, size int) Config {
	return Config{Rank: rank, WorldSize: size, MasterAddr: "127.0.0.1", MasterPort: port, Token: "test/0", Timeout: 10 * time.Second}
}

// startWorld connects size ranks, each in its own goroutine with its own
// World over real loopback sockets, edit changing each rank's Config.
func startWorld(t testing.TB, size int, edit func(*Config)) []*World {
	t.Helper()
	return worldtest.Start(t, worldtest.New(t, "test", size, size), func(w distenv.Worker) (*World, error) {
		cfg := testConfig(w.MasterPort, w.Rank, size)
		if edit != nil {
			edit(&cfg)
		}
		return Connect(context.Background(), cfg)
	})
}

// inputs returns rank r's random data, and the plain sums over ranks in
// float64.
func inputs(size, n int, seed uint64) ([][]float32, []float64) {
	data := make([][]float32, size)
	sum := make([]float64, n)
	for r := range size {
		rng := rand.New(rand.NewPCG(seed, uint64(r)))
		data[r] = make([]float32, n)
		for i := range data[r] {
			data[r][i] = float32(rng.NormFloat64())
			sum[i] += float64(data[r][i])
		}
	}
	return data, sum
}

func requireClose(t *testing.T, want []float64, got []float32, msg string) {
	t.Helper()
	require.Len(t, got, len(want), msg)
	for i := range want {
		if d := want[i] - float64(got[i]); abs(d) > 1e-4*(1+abs(want[i])) {
			require.FailNow(t, "sum differs", "%s: element %d is %g, want %g", msg, i, got[i], want[i])
		}
	}
}

// requireClose64 is requireClose for sums made in float64: of a few
// float32 values, they are exact but for the last bits.
func requireClose64(t *testing.T, want, got []float64, msg string) {
	t.Helper()
	require.Len(t, got, len(want), msg)
	for i := range want {
		if d := want[i] - got[i]; abs(d) > 1e-14*(1+abs(want[i])) {
			require.FailNow(t, "sum differs", "%s: element %d is %g, want %g", msg, i, got[i], want[i])
		}
	}
}

func widen(f []float32) []float64 {
	w := make([]float64, len(f))
	for i, v := range f {
		w[i] = float64(v)
	}
	return w
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// lengths cover empty, shorter than the group, not divisible by it, and
// several pipelined chunks.
var lengths = []int{0, 1, 3, 7, 1001, 70_001, 300_001}

func TestCollectives(t *testing.T) {
	for size := 1; size <= 4; size++ {
		t.Run(fmt.Sprintf("ranks=%d", size), func(t *testing.T) {
			worlds := startWorld(t, size, nil)
			for _, n := range lengths {
				testGroupCollectives(t, worlds, nil, n)
			}
		})
	}
}

func TestCollectivesTCPOnly(t *testing.T) {
	worlds := startWorld(t, 3, func(c *Config) { c.TCPOnly = true })
	testGroupCollectives(t, worlds, nil, 70_001)
}

// testGroupCollectives checks every collective on the group of members
// (all ranks when nil), given each rank's *Group.
func testGroupCollectives(t *testing.T, worlds []*World, groups []*Group, n int) {
	t.Helper()
	if groups == nil {
		for _, w := range worlds {
			groups = append(groups, w.All())
		}
	}
	size := len(groups)
	data, sum := inputs(size, n, uint64(n))

	t.Run(fmt.Sprintf("allreduce/n=%d", n), func(t *testing.T) {
		bufs := make([][]float32, size)
		testutil.RequireRanks(t, testutil.OnRanks(size, func(r int) error {
			bufs[r] = append([]float32(nil), data[r]...)
			return groups[r].AllReduce(bufs[r])
		}))
		for r := range size {
			requireClose(t, sum, bufs[r], fmt.Sprintf("member %d", r))
			require.Equal(t, bufs[0], bufs[r], "member %d is not bit-identical to member 0", r)
		}
	})

	t.Run(fmt.Sprintf("reducescatter/n=%d", n*size), func(t *testing.T) {
		in, full := inputs(size, n*size, uint64(n)+1)
		outs := make([][]float32, size)
		testutil.RequireRanks(t, testutil.OnRanks(size, func(r int) error {
			outs[r] = make([]float32, n)
			keep := append([]float32(nil), in[r]...)
			err := groups[r].ReduceScatter(in[r], outs[r])
			if err == nil && !equalBits(keep, in[r]) {
				err = fmt.Errorf("reducescatter changed its input")
			}
			return err
		}))
		for r := range size {
			requireClose(t, full[r*n:(r+1)*n], outs[r], fmt.Sprintf("member %d", r))
		}
	})

	t.Run(fmt.Sprintf("allreduce64/n=%d", n), func(t *testing.T) {
		bufs := make([][]float64, size)
		testutil.RequireRanks(t, testutil.OnRanks(size, func(r int) error {
			bufs[r] = widen(data[r])
			return groups[r].AllReduce64(bufs[r])
		}))
		for r := range size {
			requireClose64(t, sum, bufs[r], fmt.Sprintf("member %d", r))
			require.Equal(t, bufs[0], bufs[r], "member %d is not bit-identical to member 0", r)
		}
	})

	t.Run(fmt.Sprintf("reducescatter64/n=%d", n*size), func(t *testing.T) {
		in32, full := inputs(size, n*size, uint64(n)+2)
		outs := make([][]float64, size)
		testutil.RequireRanks(t, testutil.OnRanks(size, func(r int) error {
			in := widen(in32[r])
			outs[r] = make([]float64, n)
			err := groups[r].ReduceScatter64(in, outs[r])
			if err == nil && !slices.Equal(widen(in32[r]), in) {
				err = fmt.Errorf("reducescatter64 changed its input")
			}
			return err
		}))
		for r := range size {
			requireClose64(t, full[r*n:(r+1)*n], outs[r], fmt.Sprintf("member %d", r))
		}
	})

	t.Run(fmt.Sprintf("reducescatterwiden/n=%d", n*size), func(t *testing.T) {
		in, _ := inputs(size, n*size, uint64(n)+3)
		for r := range size {
			for i := range in[r] {
				switch {
				case i%5 == 0:
					in[r][i] = float32(math.Copysign(0, -1)) // -0 everywhere: a zeroed sum holds +0
				case i%11 == 0:
					in[r][i] = math.SmallestNonzeroFloat32 * float32(r+1)
				}
			}
		}
		want, got := make([][]float64, size), make([][]float64, size)
		testutil.RequireRanks(t, testutil.OnRanks(size, func(r int) error {
			want[r], got[r] = make([]float64, n), make([]float64, n)
			zeroed := make([]float64, n*size) // what the trainer's float64 sum held
			for i, x := range in[r] {
				zeroed[i] += float64(x)
			}
			if err := groups[r].ReduceScatter64(zeroed, want[r]); err != nil {
				return err
			}
			keep := append([]float32(nil), in[r]...)
			err := groups[r].ReduceScatterWiden(in[r], got[r])
			if err == nil && !equalBits(keep, in[r]) {
				err = fmt.Errorf("reducescatterwiden changed its input")
			}
			return err
		}))
		for r := range size {
			require.Equal(t, -1, firstDiff64(want[r], got[r]), "member %d: this element differs from ReduceScatter64 of a zeroed sum", r)
		}
	})

	t.Run(fmt.Sprintf("allgather/n=%d", n), func(t *testing.T) {
		outs := make([][]float32, size)
		testutil.RequireRanks(t, testutil.OnRanks(size, func(r int) error {
			outs[r] = make([]float32, n*size)
			return groups[r].AllGather(data[r], outs[r])
		}))
		var want []float32
		for r := range size {
			want = append(want, data[r]...)
		}
		for r := range size {
			require.True(t, equalBits(want, outs[r]), "member %d", r)
		}
	})

	t.Run(fmt.Sprintf("broadcast/n=%d", n), func(t *testing.T) {
		for root := range size {
			bufs := make([][]float32, size)
			testutil.RequireRanks(t, testutil.OnRanks(size, func(r int) error {
				bufs[r] = append([]float32(nil), data[r]...)
				return groups[r].Broadcast(bufs[r], root)
			}))
			for r := range size {
				require.True(t, equalBits(data[root], bufs[r]), "root %d, member %d", root, r)
			}
		}
	})

	t.Run("barrier", func(t *testing.T) {
		testutil.RequireRanks(t, testutil.OnRanks(size, func(r int) error { return groups[r].Barrier() }))
	})
}

// firstDiff64 is the first index where a and b differ in their bits; -1
// when none does.
func firstDiff64(a, b []float64) int {
	for i := range a {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) {
			return i
		}
	}
	return -1
}

// TestReduceScatterSpans: a reduce-scatter run in spans of the blocks
// (bounded scratch) gives the bits of one span, whatever the span: a
// span of a few elements, spans too small to pipeline, spans of several
// pipelined chunks with a shorter last one, and a span past the block. It
// runs every kind (float32, float64, float32 widened) on 2, 3 and 4
// members, the last over TCP only.
func TestReduceScatterSpans(t *testing.T) {
	m := 300_001 // elements of each member's block
	if raceEnabled {
		// The same spans below, equal to and above a block, in a tenth of
		// the messages: the 7-element span alone is 43,000 per member.
		m = 30_001
	}
	tests := []struct {
		name    string
		size    int
		tcpOnly bool
		spans   []int
	}{
		{"2 members", 2, false, []int{1000, 100_000}},
		{"3 members", 3, false, []int{7, 1000, 100_000, 2 * m}},
		{"4 members over TCP", 4, true, []int{1000, 100_000, 150_001}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			worlds := startWorld(t, tc.size, func(c *Config) { c.TCPOnly = tc.tcpOnly })
			in, _ := inputs(tc.size, m*tc.size, uint64(tc.size))
			// run reduce-scatters in with spans of span elements on every member
			run := func(span int) (out32 [][]float32, out64, outWide [][]float64) {
				out32, out64, outWide = make([][]float32, tc.size), make([][]float64, tc.size), make([][]float64, tc.size)
				testutil.RequireRanks(t, testutil.OnRanks(tc.size, func(r int) error {
					g := worlds[r].All()
					out32[r], out64[r], outWide[r] = make([]float32, m), make([]float64, m), make([]float64, m)
					if err := reduceScatterSpans(g, "reducescatter", opReduceScatter, in[r], equalBounds(tc.size, m), out32[r], span, false); err != nil {
						return err
					}
					if err := reduceScatterSpans(g, "reducescatter64", opReduceScatter64, widen(in[r]), equalBounds(tc.size, m), out64[r], span, false); err != nil {
						return err
					}
					return reduceScatterSpans(g, "reducescatter64", opReduceScatter64, in[r], equalBounds(tc.size, m), outWide[r], span, false)
				}))
				return out32, out64, outWide
			}
			if tc.size > 2 { // blocks of 8 MB in float64: the scratch stays at its bound (checked before the runs below ask for larger spans)
				const big = 1 << 20
				testutil.RequireRanks(t, testutil.OnRanks(tc.size, func(r int) error {
					return worlds[r].All().ReduceScatter64(make([]float64, big*tc.size), make([]float64, big))
				}))
				for k, buf := range worlds[0].All().scratch {
					require.LessOrEqual(t, cap(buf), scratchBytes, "scratch %d", k)
				}
			}
			want32, want64, wantWide := run(m)
			for _, span := range tc.spans {
				got32, got64, gotWide := run(span)
				for r := range tc.size {
					require.True(t, equalBits(want32[r], got32[r]), "span %d, member %d: float32", span, r)
					require.Equal(t, -1, firstDiff64(want64[r], got64[r]), "span %d, member %d: float64", span, r)
					require.Equal(t, -1, firstDiff64(wantWide[r], gotWide[r]), "span %d, member %d: widened", span, r)
				}
			}
		})
	}
}

func equalBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] && !(a[i] != a[i] && b[i] != b[i]) {
			return false
		}
	}
	return true
}

func TestSubGroups(t *testing.T) {
	worlds := startWorld(t, 4, nil)
	// HSDP on 2 nodes x 2: shard groups {0,1} {2,3}, replica groups {0,2} {1,3};
	// and a group in an order of its own.
	shard := [][]int{{0, 1}, {0, 1}, {2, 3}, {2, 3}}
	replica := [][]int{{0, 2}, {1, 3}, {0, 2}, {1, 3}}
	odd := []int{3, 0, 2}
	type gs struct{ shard, replica, odd *Group }
	groups := make([]gs, 4)
	testutil.RequireRanks(t, testutil.OnRanks(4, func(r int) error {
		var err error
		if groups[r].shard, err = worlds[r].Group(shard[r]); err != nil {
			return err
		}
		if groups[r].replica, err = worlds[r].Group(replica[r]); err != nil {
			return err
		}
		if r != 1 {
			groups[r].odd, err = worlds[r].Group(odd)
		}
		return err
	}))
	pick := func(members []int, f func(gs) *Group) ([]*World, []*Group) {
		var ws []*World
		var out []*Group
		for _, r := range members {
			ws, out = append(ws, worlds[r]), append(out, f(groups[r]))
		}
		return ws, out
	}
	for _, members := range [][]int{{0, 1}, {2, 3}} {
		ws, g := pick(members, func(x gs) *Group { return x.shard })
		testGroupCollectives(t, ws, g, 1001)
	}
	for _, members := range [][]int{{0, 2}, {1, 3}} {
		ws, g := pick(members, func(x gs) *Group { return x.replica })
		testGroupCollectives(t, ws, g, 70_001)
	}
	ws, g := pick(odd, func(x gs) *Group { return x.odd })
	require.Equal(t, 2, g[2].Rank(), "rank 2 is the third of [3 0 2]")
	testGroupCollectives(t, ws, g, 7)

	// Both kinds of group at once, as HSDP's backward does on different
	// buffers: the groups' connections are their own.
	testutil.RequireRanks(t, testutil.OnRanks(4, func(r int) error {
		a, b := make([]float32, 100_000), make([]float32, 100_000)
		errs := testutil.OnRanks(2, func(k int) error {
			if k == 0 {
				return groups[r].shard.AllReduce(a)
			}
			return groups[r].replica.AllReduce(b)
		})
		return errorsJoin(errs)
	}))
}

func errorsJoin(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func TestGroupBadInput(t *testing.T) {
	worlds := startWorld(t, 2, nil)
	w := worlds[0]
	for _, ranks := range [][]int{{0, 2}, {0, 0}, {1}, {-1, 0}} {
		_, err := w.Group(ranks)
		require.Error(t, err, "%v", ranks)
	}
	g := w.All()
	require.ErrorContains(t, g.ReduceScatter(make([]float32, 5), make([]float32, 2)), "len(in) = 5")
	require.ErrorContains(t, g.AllGather(make([]float32, 2), make([]float32, 5)), "len(out) = 5")
	require.ErrorContains(t, g.Broadcast(nil, 2), "root 2")
	// Nothing was sent: the world still works.
	testutil.RequireRanks(t, testutil.OnRanks(2, func(r int) error { return worlds[r].All().Barrier() }))
}

func TestBytes(t *testing.T) {
	worlds := startWorld(t, 3, nil)
	payload := func(r int) []byte { return []byte(fmt.Sprintf("rank %d %s", r, string(make([]byte, r*100_000)))) }
	got := make([][][]byte, 3)
	testutil.RequireRanks(t, testutil.OnRanks(3, func(r int) error {
		var err error
		got[r], err = worlds[r].All().AllGatherBytes(payload(r))
		return err
	}))
	for r := range 3 {
		for k := range 3 {
			require.Equal(t, payload(k), got[r][k])
		}
	}
	bc := make([][]byte, 3)
	testutil.RequireRanks(t, testutil.OnRanks(3, func(r int) error {
		var in []byte
		if r == 2 {
			in = payload(2)
		}
		var err error
		bc[r], err = worlds[r].All().BroadcastBytes(in, 2)
		return err
	}))
	for r := range 3 {
		require.Equal(t, payload(2), bc[r])
	}
}

func TestMismatchNamesPeer(t *testing.T) {
	worlds := startWorld(t, 3, func(c *Config) { c.Timeout = 5 * time.Second })
	errs := testutil.OnRanks(3, func(r int) error {
		n := 100
		if r == 1 {
			n = 200
		}
		return worlds[r].All().AllReduce(make([]float32, n))
	})
	for r, err := range errs {
		var pe *PeerError
		require.ErrorAs(t, err, &pe, "rank %d", r)
		require.NotEqual(t, r, pe.Rank, "rank %d blames itself: %v", r, err)
		require.ErrorContains(t, err, "allreduce of 200 elements", "rank %d", r)
	}
	// The world is unusable afterwards, and says why.
	require.ErrorContains(t, worlds[2].All().Barrier(), "allreduce of 200 elements")
}

func TestStaleRoundRefused(t *testing.T) {
	stale := make(chan error, 1)
	worlds := worldtest.Start(t, worldtest.New(t, "test", 2, 2), func(w distenv.Worker) (*World, error) {
		if w.Rank == 1 {
			// A worker of the previous round comes first, as rank 1.
			cfg := testConfig(w.MasterPort, 1, 2)
			cfg.Token = "test/-1"
			_, err := Connect(context.Background(), cfg)
			stale <- err
		}
		return Connect(context.Background(), testConfig(w.MasterPort, w.Rank, 2))
	})
	err := <-stale
	require.ErrorContains(t, err, "refused: it runs another round")
	require.NotContains(t, err.Error(), "test/0", "the round's token is not told to a refused peer")

	// A stale worker that dials a rank directly is refused too.
	w := worlds[0]
	cfg := worlds[1].cfg
	cfg.Token = "test/-1"
	intruder := &World{cfg: cfg, timeout: cfg.Timeout, auth: newAuth(cfg.Secret, cfg.Token), peers: w.peers, self: worlds[1].self}
	_, err = intruder.dial(context.Background(), 0, kindData, "0,1#0")
	require.ErrorContains(t, err, "refused: it runs another round")
	// ...and the round goes on.
	testutil.RequireRanks(t, testutil.OnRanks(2, func(r int) error { return worlds[r].All().AllReduce(make([]float32, 10)) }))
}

func TestConnectTimeout(t *testing.T) {
	t.Run("no master", func(t *testing.T) {
		cfg := testConfig(testutil.FreePort(t), 1, 2)
		cfg.Timeout = 300 * time.Millisecond
		_, err := Connect(context.Background(), cfg)
		require.ErrorContains(t, err, "bootstrap store of rank 0")
		require.ErrorContains(t, err, "no answer before the timeout")
	})
	t.Run("missing rank", func(t *testing.T) {
		cfg := testConfig(testutil.FreePort(t), 0, 3)
		cfg.Timeout = 300 * time.Millisecond
		_, err := Connect(context.Background(), cfg)
		require.ErrorContains(t, err, "ranks [1 2] did not register")
	})
	t.Run("context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := Connect(ctx, testConfig(testutil.FreePort(t), 1, 2))
		require.Error(t, err)
	})
	t.Run("bad config", func(t *testing.T) {
		for _, cfg := range []Config{
			{WorldSize: 0}, {Rank: 2, WorldSize: 2},
			{WorldSize: 1, MasterAddr: "x"}, {WorldSize: 1, MasterAddr: "x", MasterPort: 1},
			{WorldSize: 1, MasterAddr: "x", MasterPort: 1, Token: "t", BindAddr: "0.0.0.0"},
		} {
			_, err := Connect(context.Background(), cfg)
			require.Error(t, err, "%+v", cfg)
		}
	})
}

func TestCloseIsNoFailure(t *testing.T) {
	worlds := startWorld(t, 3, nil)
	testutil.RequireRanks(t, testutil.OnRanks(3, func(r int) error { return worlds[r].All().AllReduce(make([]float32, 1000)) }))
	require.NoError(t, worlds[0].Close())
	time.Sleep(50 * time.Millisecond) // let the goodbye arrive; a death would show now
	require.NoError(t, worlds[1].broken("check"))
	require.NoError(t, worlds[2].broken("check"))
	err := worlds[1].All().Barrier()
	require.ErrorContains(t, err, "peer rank 0")
	require.ErrorContains(t, err, "closed its World")
	require.ErrorIs(t, worlds[0].All().Barrier(), ErrClosed)
}
