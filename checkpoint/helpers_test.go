package checkpoint

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/testutil"
)

// testDeadline bounds every collective in these tests.
const testDeadline = 30 * time.Second

// spec is one tensor of the test state.
type spec struct {
	name  string
	shape []int64
}

// testSpecs has lengths that 2, 3 and 4 do not divide, several checksum blocks at the small test
// block size, a scalar and an empty tensor.
func testSpecs() []spec {
	return []spec{
		{"wte", []int64{257, 61}},
		{"blocks.0.attn.w", []int64{64, 192}},
		{"bias", []int64{7}},
		{"scale", nil},
		{"empty", []int64{0, 3}},
		{"adam.m.wte", []int64{15677}},
	}
}

// state is the full tensors of a step: a pure function of (specs, step).
func makeState(specs []spec, step int64) map[string][]float32 {
	out := map[string][]float32{}
	for i, s := range specs {
		r := rand.New(rand.NewPCG(uint64(step), uint64(i)))
		d := make([]float32, numel(s.shape))
		for j := range d {
			d[j] = float32(r.NormFloat64())
		}
		out[s.name] = d
	}
	return out
}

// rankTensors is what rank holds of state in world: shard s of every tensor.
func rankTensors(specs []spec, state map[string][]float32, w World, rank int) []Tensor {
	_, shard := w.Coords(rank)
	var out []Tensor
	for _, s := range specs {
		full := state[s.name]
		lo, hi := ShardRange(int64(len(full)), shard, w.Shards)
		out = append(out, Tensor{Name: s.name, Shape: s.shape, Offset: lo, Data: full[lo:hi]})
	}
	return out
}

// rankRequests asks for rank's shard of every tensor in world.
func rankRequests(specs []spec, w World, rank int) []Request {
	_, shard := w.Coords(rank)
	var out []Request
	for _, s := range specs {
		lo, hi := ShardRange(numel(s.shape), shard, w.Shards)
		out = append(out, Request{Name: s.name, Offset: lo, Dst: make([]float32, hi-lo)})
	}
	return out
}

// onRanks runs f for every rank of w as goroutines over a local group and returns each error.
func onRanks(w World, f func(ctx context.Context, c Coordinator) error) []error {
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	group := NewLocalGroup(w.Size())
	return testutil.OnRanks(len(group), func(r int) error { return f(ctx, group[r]) })
}

// saveWorld saves state as step in dir from every rank of w and requires success.
func saveWorld(t *testing.T, dir string, w World, step int64, specs []spec, state map[string][]float32, tweak func(*Config)) {
	t.Helper()
	errs := onRanks(w, func(ctx context.Context, c Coordinator) error {
		cfg := Config{Dir: dir, World: w, Coord: c, BlockBytes: 4096}
		if tweak != nil {
			tweak(&cfg)
		}
		s, err := NewSaver(cfg)
		if err != nil {
			return err
		}
		return s.Save(ctx, Meta{Step: step, SampleIndex: step * 32, RNG: []byte{byte(step), 1, 2}, ConfigHash: "cfg"},
			rankTensors(specs, state, w, c.Rank()))
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// loadWorld loads dir at layout w on every rank and returns each rank's result and requests.
func loadWorld(w World, dir string, specs []spec) ([]*Loaded, [][]Request, []error) {
	loaded := make([]*Loaded, w.Size())
	reqs := make([][]Request, w.Size())
	errs := onRanks(w, func(ctx context.Context, c Coordinator) error {
		reqs[c.Rank()] = rankRequests(specs, w, c.Rank())
		var err error
		loaded[c.Rank()], err = Load(ctx, c, dir, reqs[c.Rank()])
		return err
	})
	return loaded, reqs, errs
}

// requireHolds checks every request holds its part of state bit for bit.
func requireHolds(t *testing.T, state map[string][]float32, reqs []Request) {
	t.Helper()
	for _, r := range reqs {
		want := state[r.Name][r.Offset : r.Offset+int64(len(r.Dst))]
		for i := range want {
			if math.Float32bits(want[i]) != math.Float32bits(r.Dst[i]) {
				require.Failf(t, "data differs", "tensor %s element %d: want %v, got %v", r.Name, r.Offset+int64(i), want[i], r.Dst[i])
			}
		}
	}
}
