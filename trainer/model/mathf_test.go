package model

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestExpf(t *testing.T) {
	worst := 0.0
	for x := -87.0; x <= 88; x += 0.001 {
		got, want := float64(expf(float32(x))), math.Exp(float64(float32(x)))
		worst = max(worst, math.Abs(got-want)/want)
	}
	t.Logf("worst relative error %.2e", worst)
	require.Less(t, worst, 2e-7)
	require.Zero(t, expf(-100))
	require.Zero(t, expf(float32(math.Inf(-1))))
	require.True(t, math.IsInf(float64(expf(100)), 1))
	require.Equal(t, float32(1), expf(0))
}

func TestTanhf(t *testing.T) {
	worst := 0.0
	for x := -50.0; x <= 50; x += 0.0005 {
		worst = max(worst, math.Abs(float64(tanhf(float32(x)))-math.Tanh(float64(float32(x)))))
	}
	t.Logf("worst absolute error %.2e", worst)
	require.Less(t, worst, 1e-6)
	require.Equal(t, float32(0), tanhf(0))
}

// BenchmarkExp compares expf with math.Exp on the same softmax-like inputs in one run; the
// ratio of their ns/op is what matters on a shared machine.
func BenchmarkExp(b *testing.B) {
	xs := make([]float32, 4096)
	for i := range xs {
		xs[i] = -float32(i) / 256
	}
	var sink float32
	b.Run("expf", func(b *testing.B) {
		for b.Loop() {
			for _, x := range xs {
				sink += expf(x)
			}
		}
	})
	b.Run("math.Exp", func(b *testing.B) {
		for b.Loop() {
			for _, x := range xs {
				sink += float32(math.Exp(float64(x)))
			}
		}
	})
	_ = sink
}
