package hsdp

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/trainer/comm"
	"github.com/gorun/gorun/trainer/internal/worldtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPlan(t *testing.T) {
	tests := []struct {
		name                  string
		rank, world, shards   int
		shard, replica        int
		shardGroup, replGroup []int
		lo, hi                int // of a buffer of 12
	}{
		{"single", 0, 1, 1, 0, 0, []int{0}, []int{0}, 0, 12},
		{"ddp", 2, 4, 1, 0, 2, []int{2}, []int{0, 1, 2, 3}, 0, 12},
		{"fsdp", 2, 4, 4, 2, 0, []int{0, 1, 2, 3}, []int{2}, 6, 9},
		{"hsdp first node", 1, 4, 2, 1, 0, []int{0, 1}, []int{1, 3}, 6, 12},
		{"hsdp second node", 2, 4, 2, 0, 1, []int{2, 3}, []int{0, 2}, 0, 6},
		{"hsdp 3 nodes of 2", 5, 6, 2, 1, 2, []int{4, 5}, []int{1, 3, 5}, 6, 12},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPlan(tc.rank, tc.world, tc.shards)
			require.NoError(t, err)
			require.Equal(t, tc.world, p.WorldSize())
			require.Equal(t, tc.shard, p.Shard())
			require.Equal(t, tc.replica, p.Replica())
			require.Equal(t, tc.shardGroup, p.ShardGroup())
			require.Equal(t, tc.replGroup, p.ReplicaGroup())
			lo, hi := p.Owned(12)
			require.Equal(t, []int{tc.lo, tc.hi}, []int{lo, hi})
		})
	}
}

func TestPlanErrors(t *testing.T) {
	tests := []struct {
		name                string
		rank, world, shards int
		want                string
	}{
		{"no world", 0, 0, 1, "world size 0"},
		{"rank past world", 4, 4, 2, "rank 4 outside world size 4"},
		{"negative rank", -1, 4, 2, "rank -1 outside"},
		{"shards do not divide", 0, 6, 4, "shard size 4 does not divide world size 6"},
		{"zero shards", 0, 4, 0, "shard size 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewPlan(tc.rank, tc.world, tc.shards)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// connect starts size ranks in goroutines, each with its own comm.World
// over loopback sockets, and joins the groups of a layout with shards.
func connect(t *testing.T, size, shards int) []*Groups {
	t.Helper()
	worlds := worldtest.Start(t, worldtest.New(t, "hsdp-test", size, size), func(w distenv.Worker) (*comm.World, error) {
		cfg := comm.ConfigFrom(w, jobsecret.Secret{})
		cfg.Timeout = 10 * time.Second
		return comm.Connect(context.Background(), cfg)
	})
	groups := make([]*Groups, size)
	testutil.RequireRanks(t, testutil.OnRanks(size, func(r int) error {
		p, err := NewPlan(r, size, shards)
		if err != nil {
			return err
		}
		groups[r], err = Join(worlds[r], p)
		return err
	}))
	return groups
}

// each runs f on every rank at once and requires no errors.
func each(t *testing.T, groups []*Groups, f func(r int, g *Groups) error) {
	t.Helper()
	testutil.RequireRanks(t, testutil.OnRanks(len(groups), func(r int) error { return f(r, groups[r]) }))
}

// cuts are the ends of the parts TestStep reduces and gathers a buffer of
// n = 4000 elements in: parts that end inside a slice, span slices, lie in
// one, or are empty.
var cuts = []int{1, 999, 1000, 1000, 2500, 3999, 4000}

// TestStep: gradients reduced part by part (ReducePart, ReduceReplicas),
// statistics, and parameters gathered part by part (GatherPart) over every
// layout of 4 ranks give what one process computes, every replica of a
// slice gets the same bits, and the reduced gradients rounded to float32
// are the same bits in every layout.
func TestStep(t *testing.T) {
	const world, n = 4, 4 * 1000
	for _, shards := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("%dx%d", world/shards, shards), func(t *testing.T) {
			groups := connect(t, world, shards)
			rng := rand.New(rand.NewPCG(1, uint64(shards)))
			grads := make([][]float32, world)
			sum := make([]float64, n)
			for r := range grads {
				grads[r] = make([]float32, n)
				for i := range grads[r] {
					grads[r][i] = float32(rng.NormFloat64())
					sum[i] += float64(grads[r][i])
				}
			}
			var norm2 float64
			for _, s := range sum {
				norm2 += s * s
			}
			owned := make([][]float64, world)
			losses := make([]float64, world)
			norms := make([]float64, world)
			each(t, groups, func(r int, g *Groups) error {
				owned[r] = make([]float64, n/shards)
				a := 0
				for _, b := range cuts {
					if err := g.ReducePart(grads[r][a:b], a, n, owned[r]); err != nil {
						return err
					}
					a = b
				}
				if err := g.ReduceReplicas(owned[r]); err != nil {
					return err
				}
				var ss float64
				for _, x := range owned[r] {
					ss += float64(x) * float64(x)
				}
				var err error
				var stop bool
				losses[r], norms[r], stop, err = g.Stats(float64(r+1), ss, r == world-1)
				if err == nil && !stop {
					err = fmt.Errorf("rank %d: the last rank asked to stop, and Stats says nobody did", r)
				}
				return err
			})
			for r, g := range groups {
				lo, hi := g.Plan().Owned(n)
				for i := lo; i < hi; i++ {
					require.InDelta(t, sum[i], owned[r][i-lo], 1e-12, "rank %d element %d", r, i)
					require.Equal(t, float32(sum[i]), float32(owned[r][i-lo]), "rank %d element %d, rounded", r, i)
				}
				peer := g.Plan().ReplicaGroup()[0]
				require.Equal(t, owned[peer], owned[r], "rank %d and its replica %d", r, peer)
				require.Equal(t, 2.5, losses[r], "mean of 1..4")
				require.InEpsilon(t, norm2, norms[r], 1e-6)
				require.Equal(t, norms[0], norms[r], "the same bits everywhere")
			}

			params := make([][]float32, world)
			each(t, groups, func(r int, g *Groups) error {
				lo, hi := g.Plan().Owned(n)
				mine := make([]float32, hi-lo)
				for i := range mine {
					mine[i] = float32(lo + i)
				}
				params[r] = make([]float32, n)
				a := 0
				for _, b := range cuts {
					if err := g.GatherPart(mine, params[r][a:b], a, n); err != nil {
						return err
					}
					a = b
				}
				return nil
			})
			for r := range params {
				for i, p := range params[r] {
					require.Equal(t, float32(i), p, "rank %d element %d", r, i)
				}
			}
		})
	}
}

func TestJoinErrors(t *testing.T) {
	p, err := NewPlan(0, 2, 2)
	require.NoError(t, err)
	_, err = Join(nil, p)
	require.ErrorContains(t, err, "needs a comm.World")

	solo, err := NewPlan(0, 1, 1)
	require.NoError(t, err)
	g, err := Join(nil, solo)
	require.NoError(t, err)
	loss, ss, stop, err := g.Stats(3, 4, true)
	require.NoError(t, err)
	require.Equal(t, []float64{3, 4}, []float64{loss, ss})
	require.True(t, stop)
	owned := []float64{1, 2}
	require.NoError(t, g.ReducePart([]float32{1}, 1, 2, owned))
	require.Equal(t, []float64{1, 3}, owned, "one rank: its gradient, added")
	require.ErrorContains(t, g.ReducePart([]float32{1, 2}, 0, 2, owned[:1]), "owned slice of 1 elements")
	require.ErrorContains(t, g.ReducePart([]float32{1, 2}, 1, 2, owned), "outside the buffer")
	part := make([]float32, 2)
	require.NoError(t, g.GatherPart([]float32{5, 6}, part, 0, 2))
	require.Equal(t, []float32{5, 6}, part)
	require.ErrorContains(t, g.GatherPart([]float32{5}, part, 0, 2), "owned slice of 1 elements")
}
