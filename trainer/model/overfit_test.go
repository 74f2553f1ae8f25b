package model

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/kernels"
	"github.com/gorun/gorun/trainer/optim"
)

// TestOverfitsOneBatch trains a tiny model with AdamW on one fixed batch of text, the way the
// trainer will (clip factor from the sum of squares, weight-decay spans from the layout), and requires
// the loss to fall from ln(256) to below 0.5.
func TestOverfitsOneBatch(t *testing.T) {
	cfg := Config{Layers: 2, DModel: 32, Heads: 4, Context: 16, Vocab: 256}
	const batch = 2
	eng := kernels.New(2)
	m, err := New(cfg, batch, eng)
	require.NoError(t, err)
	l := m.Layout()
	params := make([]float32, l.PaddedSize(3)) // padded as a 3-way shard would be
	grads := make([]float32, len(params))
	Init(cfg, params, 1)
	oc := optim.Config{LR: 1e-2, MinLR: 1e-3, Warmup: 10, Steps: 300, Beta1: 0.9, Beta2: 0.95,
		Eps: 1e-8, WeightDecay: 0.1, GradClip: 1}
	require.NoError(t, oc.Validate())
	st := optim.NewState(len(params))
	decay := l.DecaySpans(0, len(params))
	tokens := []byte("the quick brown fox jumps over the lazy dog")[:m.TokensLen()]

	first := m.Forward(params, tokens)
	loss := first
	for step := 0; step < oc.Steps && loss >= 0.5; step++ {
		clear(grads)
		m.Backward(params, grads, 1)
		clip := optim.ClipFactor(optim.SumSquares(eng, grads), oc.GradClip)
		_, err := optim.Update(eng, oc, &st, params, grads, decay, clip, kernels.Kept{})
		require.NoError(t, err)
		loss = m.Forward(params, tokens)
		if step%25 == 0 {
			t.Logf("step %3d loss %.4f", step, loss)
		}
	}
	t.Logf("after %d steps: loss %.4f (from %.4f)", st.Step, loss, first)
	require.InDelta(t, 5.545, float64(first), 0.1)
	require.Less(t, loss, float32(0.5))
	require.Equal(t, make([]float32, len(params)-l.Size), params[l.Size:], "padding stays zero")
}
