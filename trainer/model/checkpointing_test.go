package model

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/kernels"
)

// pass is what one micro batch gives: the loss of a forward pass and the gradient of two
// backward passes after it, each scaled by 0.5, and with passes over units the orders of the
// calls of Weights and Grads. (Backward adds the second pass into the first's buffer, while
// unitGrads sums two fresh buffers: the two ways round differently.)
type pass struct {
	loss        uint32
	grads       []float32
	asked, grad []int
	done        []int
}

// checkpointingCase is a model and a micro batch to run with activation checkpointing on and
// off.
type checkpointingCase struct {
	cfg     Config
	batch   int
	threads int
	bf16    bool
	split   bool // blocks in parts (see Layout.Units)
}

// splitAt is the block size from which tc's model splits blocks into parts.
func (tc checkpointingCase) splitAt() int {
	if tc.split {
		return 1
	}
	return splitBlocksFrom
}

func (tc checkpointingCase) engine() *kernels.Engine {
	eng := kernels.New(tc.threads)
	if tc.bf16 {
		eng = eng.WithPrecision(kernels.BF16)
	}
	return eng
}

// recordingGrads is unitGrads that also records the order of the calls of Grad.
type recordingGrads struct {
	unitGrads
	asked []int
}

func (g *recordingGrads) Grad(u int) ([]float32, error) {
	g.asked = append(g.asked, u)
	return g.unitGrads.Grad(u)
}

// runFlat runs two micro batches through Forward and Backward on one model (the second
// overwrites every activation of the first) and returns the second's pass.
func (tc checkpointingCase) runFlat(t *testing.T, p []float32, toks [2][]byte, on bool) pass {
	m, err := New(tc.cfg, tc.batch, tc.engine(), WithActivationCheckpointing(on))
	require.NoError(t, err)
	require.Equal(t, on, m.Checkpointing())
	var out pass
	for _, tok := range toks {
		out.loss = math.Float32bits(m.Forward(p, tok))
		out.grads = make([]float32, len(p))
		m.Backward(p, out.grads, 0.5)
		m.Backward(p, out.grads, 0.5)
	}
	return out
}

// runUnits is runFlat through ForwardUnits and BackwardUnits, one unit at a time.
func (tc checkpointingCase) runUnits(t *testing.T, p []float32, toks [2][]byte, on bool) pass {
	m, err := New(tc.cfg, tc.batch, tc.engine(), WithActivationCheckpointing(on), splitBlocksAt(tc.splitAt()))
	require.NoError(t, err)
	units := m.Units()
	var out pass
	for _, tok := range toks {
		w := &oneUnitAtATime{units: units, params: p, failAt: -1}
		loss, err := m.ForwardUnits(w, tok)
		require.NoError(t, err)
		out.loss = math.Float32bits(loss)
		g := &recordingGrads{unitGrads: unitGrads{units: units, sum: make([]float32, len(p)), open: map[int][]float32{}}}
		for i := range 2 {
			require.NoError(t, m.BackwardUnits(w, g, 0.5))
			if i == 0 {
				require.Equal(t, m.WeightsOrder(), w.asked, "WeightsOrder is the order of a forward and a backward pass")
			}
		}
		out.grads, out.asked, out.grad, out.done = g.sum, w.asked, g.asked, g.done
	}
	return out
}

// TestCheckpointingGivesTheSameBits runs the same micro batches with activation checkpointing
// on and off, through Forward and Backward and through the passes over units, and requires
// the same loss and gradient bits and the same order of the calls of Grads (and of Weights, the
// one WeightsOrder gives).
func TestCheckpointingGivesTheSameBits(t *testing.T) {
	cases := []checkpointingCase{
		{Config{Layers: 1, DModel: 8, Heads: 2, Context: 4, Vocab: 16}, 2, 1, false, false},
		{Config{Layers: 3, DModel: 16, Heads: 4, Context: 8, Vocab: 256}, 2, 2, false, false},
		{Config{Layers: 2, DModel: 32, Heads: 4, Context: 16, Vocab: 256}, 4, 3, false, false},
		{Config{Layers: 4, DModel: 64, Heads: 4, Context: 40, Vocab: 256}, 3, 1, false, false}, // 120 rows: two chunks
		{Config{Layers: 4, DModel: 64, Heads: 4, Context: 40, Vocab: 256}, 3, 2, false, false},
		{Config{Layers: 3, DModel: 64, Heads: 8, Context: 64, Vocab: 256}, 2, 2, true, false},
		{Config{Layers: 3, DModel: 16, Heads: 4, Context: 8, Vocab: 256}, 2, 2, false, true},
		{Config{Layers: 4, DModel: 64, Heads: 4, Context: 40, Vocab: 256}, 3, 2, false, true},
	}
	for _, tc := range cases {
		c := tc.cfg
		name := fmt.Sprintf("L%d_d%d_h%d_T%d_b%d_threads%d", c.Layers, c.DModel, c.Heads, c.Context, tc.batch, tc.threads)
		if tc.bf16 {
			name += "_bf16"
		}
		if tc.split {
			name += "_parts"
		}
		t.Run(name, func(t *testing.T) {
			p := noisyParams(c, 3, 0.05)
			n := tc.batch * (c.Context + 1)
			toks := [2][]byte{randomTokens(n, c.Vocab, 4), randomTokens(n, c.Vocab, 5)}

			off := tc.runFlat(t, p, toks, false)
			on := tc.runFlat(t, p, toks, true)
			require.Equal(t, off.loss, on.loss, "loss")
			require.Equal(t, off.grads, on.grads, "gradients")

			offUnits := tc.runUnits(t, p, toks, false)
			onUnits := tc.runUnits(t, p, toks, true)
			require.Equal(t, off.loss, offUnits.loss, "the passes over units give Forward's loss")
			require.Equal(t, offUnits.loss, onUnits.loss, "loss over units")
			require.Equal(t, offUnits.grads, onUnits.grads, "gradients over units")
			// The order of Unit differs: a recomputed block asks for the parts of its forward
			// pass again (runUnits checks both against WeightsOrder).
			require.Equal(t, offUnits.grad, onUnits.grad, "the order of Grad")
			require.Equal(t, offUnits.done, onUnits.done, "the order of Done")
		})
	}
}

// TestActivationBytes checks ActivationBytes against what New allocates, and that
// checkpointing keeps one block's activations besides the blocks' inputs.
func TestActivationBytes(t *testing.T) {
	for _, tc := range []struct {
		cfg   Config
		batch int
	}{
		{Config{Layers: 1, DModel: 8, Heads: 2, Context: 4, Vocab: 16}, 3},
		{defaultConfig, 8},
		{Config{Layers: 8, DModel: 512, Heads: 8, Context: 64, Vocab: 256}, 2}, // issue 22's model
		{Config{Layers: 6, DModel: 192, Heads: 6, Context: 256, Vocab: 256}, 2},
	} {
		var got [2]int64
		for i, on := range []bool{false, true} {
			m, err := New(tc.cfg, tc.batch, kernels.New(1), WithActivationCheckpointing(on))
			require.NoError(t, err)
			got[i] = m.ActivationBytes()
			require.Equal(t, ActivationBytes(tc.cfg, tc.batch, WithActivationCheckpointing(on)), got[i], "%+v on=%v", tc.cfg, on)
		}
		require.Equal(t, ActivationBytes(tc.cfg, tc.batch), got[0], "off by default")
		c := tc.cfg
		n, d := int64(tc.batch*c.Context), int64(c.DModel)
		block := 4 * (19*n*d + 4*n + int64(c.Heads)*n*int64(c.Context))
		require.Equal(t, int64(c.Layers-1)*block, got[0]-got[1], "checkpointing drops all but one block's activations")
		require.LessOrEqual(t, got[1], got[0]/int64(c.Layers)+block, "at most 1/layers of the memory without it, plus a block")
		t.Logf("%+v, micro batch %d: %d bytes, %d with checkpointing (%.3f)", c, tc.batch, got[0], got[1], float64(got[1])/float64(got[0]))
	}
	require.Zero(t, ActivationBytes(Config{}, 1))
	require.Zero(t, ActivationBytes(defaultConfig, 0))
}

func TestRecomputeFLOPsPerToken(t *testing.T) {
	require.Zero(t, Config{Layers: 1, DModel: 64, Heads: 4, Context: 64, Vocab: 256}.RecomputeFLOPsPerToken(),
		"one block: its activations are still there after the forward pass")
	// Issue 22's model, L8 d512 T64: 7 blocks of QKV, attention output and c_fc, 8d² MACs,
	// and 2·T·d MACs of attention.
	c := Config{Layers: 8, DModel: 512, Heads: 8, Context: 64, Vocab: 256}
	require.Equal(t, float64(7*2*(8*512*512+2*64*512)), c.RecomputeFLOPsPerToken())
	require.Less(t, c.RecomputeFLOPsPerToken()/c.TrainFLOPsPerToken(), 1.0/3)
}

// BenchmarkCheckpointingCost measures what activation checkpointing costs in tokens per second:
// each iteration runs one forward and backward pass with it off and one with it on, on two
// models of the same shapes, in alternating order, and times each, so that a shared machine's
// drifting load falls on both alike. It reports both rates, the cost (1 - off's time/on's time,
// the median over the iterations' pairs: robust to a load that comes and goes) and the
// activation bytes of each. The models: the bench model (bench/trainer.sh's issue 13 shapes:
// 4 layers, d_model 128, 4 heads, context 128, micro batch 16) and issue 22's (8 layers,
// d_model 512, 8 heads, context 64, micro batch 2).
func BenchmarkCheckpointingCost(b *testing.B) {
	for _, bc := range []struct {
		name  string
		cfg   Config
		batch int
	}{
		{"bench", Config{Layers: 4, DModel: 128, Heads: 4, Context: 128, Vocab: 256}, 16},
		{"issue22", Config{Layers: 8, DModel: 512, Heads: 8, Context: 64, Vocab: 256}, 2},
	} {
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/threads=%d", bc.name, threads), func(b *testing.B) {
				eng := kernels.New(threads)
				var ms [2]*Model
				for i := range ms {
					m, err := New(bc.cfg, bc.batch, eng, WithActivationCheckpointing(i == 1))
					require.NoError(b, err)
					ms[i] = m
				}
				p := make([]float32, ms[0].Layout().Size)
				g := make([]float32, len(p))
				Init(bc.cfg, p, 1)
				tok := randomTokens(ms[0].TokensLen(), 256, 1)
				var spent [2]time.Duration
				var ratios []float64 // off's time over on's, per iteration
				for b.Loop() {
					var took [2]time.Duration
					for k := range 2 {
						j := (len(ratios) + k) % 2
						start := time.Now()
						ms[j].Forward(p, tok)
						ms[j].Backward(p, g, 1)
						took[j] = time.Since(start)
						spent[j] += took[j]
					}
					ratios = append(ratios, took[0].Seconds()/took[1].Seconds())
				}
				slices.Sort(ratios)
				tokens := float64(b.N * bc.batch * bc.cfg.Context)
				b.ReportMetric(tokens/spent[0].Seconds(), "tokens/s-off")
				b.ReportMetric(tokens/spent[1].Seconds(), "tokens/s-on")
				b.ReportMetric(100*(1-ratios[len(ratios)/2]), "cost-%")
				b.ReportMetric(float64(ms[0].ActivationBytes())/1e6, "MB-off")
				b.ReportMetric(float64(ms[1].ActivationBytes())/1e6, "MB-on")
			})
		}
	}
}
