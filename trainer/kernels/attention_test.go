package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// lowerTriangular returns a random t×t matrix with zeros above the diagonal.
func lowerTriangular(rng *rand.Rand, t int) []float32 {
	a := randomMatrix(rng, t*t)
	for i := range t {
		clear(a[i*t+i+1 : (i+1)*t])
	}
	return a
}

func randomMatrix(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.NormFloat64())
	}
	return s
}

// TestCausalProductsAgree holds CausalScores, CausalApply and CausalApplyT on every kernel
// this CPU runs (and the bf16 ones, which compute the full product) to the plain product,
// on sizes that do and do not fill the micro-kernels' tiles.
func TestCausalProductsAgree(t *testing.T) {
	kernels := append(Available(), AvailableBF16()...)
	for _, name := range kernels {
		for _, tc := range []struct{ t, d int }{
			{1, 1}, {5, 3}, {12, 8}, {13, 16}, {31, 32}, {32, 32}, {33, 16}, {64, 32}, {100, 24}, {128, 32}, {130, 64}, {40, 40},
		} {
			t.Run(fmt.Sprintf("%s/t%d_d%d", name, tc.t, tc.d), func(t *testing.T) {
				e, err := NewWithKernel(1, name)
				require.NoError(t, err)
				tol := 1e-4
				if e.bf != nil {
					tol = 2e-2
				}
				rng := rand.New(rand.NewPCG(uint64(tc.t), uint64(tc.d)))
				n, d := tc.t, tc.d
				a, b := randomMatrix(rng, n*d), randomMatrix(rng, n*d)
				lower := lowerTriangular(rng, n)

				got, want := make([]float32, n*n), make([]float32, n*n)
				e.CausalScores(got, a, b, n, d)
				naiveMatMul(want, a, b, n, n, d, false, true, false)
				for i := range n {
					requireCausalClose(t, want[i*n:i*n+i+1], got[i*n:i*n+i+1], tol, "CausalScores row %d", i)
				}

				got, want = make([]float32, n*d), make([]float32, n*d)
				e.CausalApply(got, lower, b, n, d)
				naiveMatMul(want, lower, b, n, d, n, false, false, false)
				requireCausalClose(t, want, got, tol, "CausalApply")

				e.CausalApplyT(got, lower, b, n, d)
				naiveMatMul(want, lower, b, n, d, n, true, false, false)
				requireCausalClose(t, want, got, tol, "CausalApplyT")
			})
		}
	}
}

func requireCausalClose(t *testing.T, want, got []float32, tol float64, msg string, args ...any) {
	t.Helper()
	for i := range want {
		w := float64(want[i])
		require.InDelta(t, w, float64(got[i]), tol*(1+math.Abs(w))*10, "%s: element %d", fmt.Sprintf(msg, args...), i)
	}
}

// TestCausalProductsPanic checks that shapes the slices cannot hold panic.
func TestCausalProductsPanic(t *testing.T) {
	e := New(1)
	s := make([]float32, 15)
	require.Panics(t, func() { e.CausalScores(s, s, s, 4, 4) })
	require.Panics(t, func() { e.CausalApply(s, s, s, 4, 1) })
	require.Panics(t, func() { e.CausalApplyT(s, s, s, -1, 1) })
}
