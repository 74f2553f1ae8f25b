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

// widen returns the rows×cols matrix x as columns off.. of a rows×stride matrix of random
// values around it.
func widen(rng *rand.Rand, x []float32, rows, cols, stride, off int) Strided {
	w := randomMatrix(rng, rows*stride)
	for i := range rows {
		copy(w[i*stride+off:][:cols], x[i*cols:][:cols])
	}
	return Strided{Data: w[off:], Stride: stride}
}

// TestCausalProductsStrided checks that the Strided products give the contiguous ones'
// bits, on every kernel this CPU runs and the bf16 ones, and leave C's other columns alone.
func TestCausalProductsStrided(t *testing.T) {
	for _, name := range append(Available(), AvailableBF16()...) {
		for _, tc := range []struct{ t, d int }{{1, 1}, {13, 16}, {33, 16}, {64, 32}, {128, 32}, {130, 24}} {
			t.Run(fmt.Sprintf("%s/t%d_d%d", name, tc.t, tc.d), func(t *testing.T) {
				e, err := NewWithKernel(1, name)
				require.NoError(t, err)
				rng := rand.New(rand.NewPCG(uint64(tc.t), 7))
				n, d := tc.t, tc.d
				a, b, lower := randomMatrix(rng, n*d), randomMatrix(rng, n*d), lowerTriangular(rng, n)
				sa, sb := widen(rng, a, n, d, 3*d+5, d), widen(rng, b, n, d, 3*d+5, 2*d)
				sl := widen(rng, lower, n, n, n+3, 1)

				want := make([]float32, n*n)
				e.CausalScores(want, a, b, n, d)
				got := widen(rng, make([]float32, n*n), n, n, n+2, 1)
				before := append([]float32(nil), got.Data...)
				e.CausalScoresStrided(got, sa, sb, n, d)
				for i := range n {
					require.Equal(t, want[i*n:i*n+i+1], got.Data[i*got.Stride:][:i+1], "CausalScores row %d", i)
					if i+1 < n {
						require.Equal(t, before[i*got.Stride+n:][:got.Stride-n], got.Data[i*got.Stride+n:][:got.Stride-n], "CausalScores row %d past n", i)
					}
				}

				for _, op := range []struct {
					name    string
					plain   func(c, a, b []float32, t, n int)
					strided func(c, a, b Strided, t, n int)
				}{{"CausalApply", e.CausalApply, e.CausalApplyStrided}, {"CausalApplyT", e.CausalApplyT, e.CausalApplyTStrided}} {
					want := make([]float32, n*d)
					op.plain(want, lower, b, n, d)
					got := widen(rng, make([]float32, n*d), n, d, 3*d, 2*d)
					before := append([]float32(nil), got.Data...)
					op.strided(got, sl, sb, n, d)
					for i := range n {
						require.Equal(t, want[i*d:][:d], got.Data[i*got.Stride:][:d], "%s row %d", op.name, i)
						if i+1 < n {
							require.Equal(t, before[i*got.Stride+d:][:got.Stride-d], got.Data[i*got.Stride+d:][:got.Stride-d], "%s row %d past d", op.name, i)
						}
					}
				}
			})
		}
	}
}
