package model

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/kernels"
)

// TestBF16 runs a micro-batch on bf16 GEMMs: the loss is within 1 % of
// fp32's and the gradient points the same way (cosine > 0.999); a
// position's loss does not depend on later tokens; and the result does
// not depend on the threads, nor on the bf16 kernel (assembly or
// portable, bit for bit).
func TestBF16(t *testing.T) {
	cfg := Config{Layers: 2, DModel: 64, Heads: 4, Context: 64, Vocab: 256}
	p := noisyParams(cfg, 3, 0.05)
	tok := randomTokens(4*(cfg.Context+1), 256, 4)
	run := func(eng *kernels.Engine, tok []byte) (*Model, float32, []float32) {
		m, err := New(cfg, 4, eng)
		require.NoError(t, err)
		g := make([]float32, m.Layout().Size)
		loss := m.Forward(p, tok)
		m.Backward(p, g, 1)
		return m, loss, g
	}
	_, l32, g32 := run(kernels.New(2), tok)
	bf, lbf, gbf := run(kernels.New(2).WithPrecision(kernels.BF16), tok)
	require.InEpsilon(t, l32, lbf, 0.01)
	var dot, n32, nbf float64
	for i := range g32 {
		dot += float64(g32[i]) * float64(gbf[i])
		n32 += float64(g32[i]) * float64(g32[i])
		nbf += float64(gbf[i]) * float64(gbf[i])
	}
	require.Greater(t, dot/math.Sqrt(n32*nbf), 0.999)

	// Change the last input of the first sequence (the target of the one before): the losses
	// of the positions before those two may not change.
	late := append([]byte(nil), tok...)
	last := cfg.Context - 1
	late[last] ^= 0x55
	changed, _, _ := run(kernels.New(2).WithPrecision(kernels.BF16), late)
	require.Equal(t, bf.rowLoss[:last-1], changed.rowLoss[:last-1], "causal")
	require.NotEqual(t, bf.rowLoss[last], changed.rowLoss[last])

	for _, kernel := range kernels.AvailableBF16() {
		for _, threads := range []int{1, 3} {
			eng, err := kernels.NewWithKernel(threads, kernel)
			require.NoError(t, err)
			_, l, g := run(eng, tok)
			require.Equal(t, math.Float32bits(lbf), math.Float32bits(l), "%s t%d", kernel, threads)
			require.Equal(t, gbf, g, "%s t%d", kernel, threads)
		}
	}
}
