package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
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
	require.Equal(t, expf(-87), expf(-100), "clamped below")
	require.Equal(t, expf(-87), expf(float32(math.Inf(-1))))
	require.Equal(t, expf(88), expf(100), "clamped above")
	require.Equal(t, float32(1), expf(0))
}

// vecLengths cover empty, shorter than one vector, whole vectors of 8
// and 16 lanes, and whole vectors with a tail.
var vecLengths = []int{0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 100, 257}

// TestExpSum checks every kernel the CPU runs against math.Exp, element
// by element and in the sum, in place and not.
func TestExpSum(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, kern := range kernelsForCPU() {
		e := newEngine(1, kern)
		for _, n := range vecLengths {
			for _, inPlace := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/n=%d/inplace=%v", kern.name, n, inPlace), func(t *testing.T) {
					src := make([]float32, n)
					for i := range src {
						src[i] = r.Float32()*40 - 30 // some past the clamp after scaling
					}
					const scale, shift = 2.5, 3
					// The float32 argument x·scale - shift is itself rounded
					// (once or twice): its error of up to 2 ulps, relative
					// 1.2e-7, becomes |arg|·1.2e-7 relative in exp(arg).
					want, tol, wantSum := make([]float64, n), make([]float64, n), 0.0
					for i, x := range src {
						arg := min(max(float64(x)*scale-shift, -87), 88)
						want[i], tol[i] = math.Exp(arg), 3e-7+1.2e-7*math.Abs(arg)
						wantSum += want[i]
					}
					dst := make([]float32, n)
					if inPlace {
						dst = src
					}
					sum := e.ExpSum(dst, src, scale, shift)
					for i := range want {
						require.InDelta(t, want[i], float64(dst[i]), want[i]*tol[i], "element %d", i)
					}
					if n == 0 {
						require.Zero(t, sum)
						return
					}
					require.InEpsilon(t, wantSum, float64(sum), 1e-5)
				})
			}
		}
	}
}

// TestGELU checks every kernel the CPU runs against the float64 formulas
// of GELU and its derivative with math.Tanh, on inputs from deep negative
// to saturated positive.
func TestGELU(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for _, kern := range kernelsForCPU() {
		e := newEngine(1, kern)
		for _, n := range vecLengths {
			t.Run(fmt.Sprintf("%s/n=%d", kern.name, n), func(t *testing.T) {
				h := make([]float32, n)
				for i := range h {
					h[i] = r.Float32()*24 - 12
				}
				if n > 2 {
					h[0], h[1] = -60, 60 // tanh saturates
				}
				out, dgelu := make([]float32, n), make([]float32, n)
				e.GELU(out, dgelu, h)
				for i, v := range h {
					x := float64(v)
					tw := math.Tanh(geluC * (x + 0.044715*x*x*x))
					require.InDelta(t, 0.5*x*(1+tw), float64(out[i]), 1e-6*max(1, math.Abs(x)), "element %d (%v)", i, v)
					// The derivative moves with t by 0.5 - x·t·sqrt(2/pi)·(1 + 3·0.044715 x²),
					// and t is within 1e-6 of tanh.
					slope := 0.5 + math.Abs(x)*geluC*(1+3*0.044715*x*x)
					want := 0.5*(1+tw) + 0.5*x*(1-tw*tw)*geluC*(1+3*0.044715*x*x)
					require.InDelta(t, want, float64(dgelu[i]), 1e-6*(1+slope), "derivative of element %d (%v)", i, v)
				}
			})
		}
	}
}

// TestVecMathKeepsNaN checks that a NaN input gives a NaN output in
// every kernel, wherever it falls in the vectors: the clamp of the
// exponential must not turn it into a number (a diverged run must show
// as NaN, not as plausible figures).
func TestVecMathKeepsNaN(t *testing.T) {
	nan := float32(math.NaN())
	for _, kern := range kernelsForCPU() {
		e := newEngine(1, kern)
		for _, at := range []int{0, 5, 16, 33} {
			src := make([]float32, 40)
			src[at] = nan
			dst, dgelu := make([]float32, len(src)), make([]float32, len(src))
			require.True(t, math.IsNaN(float64(e.ExpSum(dst, src, 1, 0))), "%s: sum, NaN at %d", kern.name, at)
			require.True(t, math.IsNaN(float64(dst[at])), "%s: exp, NaN at %d", kern.name, at)
			e.GELU(dst, dgelu, src)
			require.True(t, math.IsNaN(float64(dgelu[at])), "%s: derivative, NaN at %d", kern.name, at)
			require.True(t, math.IsNaN(float64(dst[at])), "%s: gelu, NaN at %d", kern.name, at)
		}
	}
}

// TestMaxScale checks Max and Scale of every kernel the CPU runs against
// plain loops, with the maximum at every position, and Max's NaN.
func TestMaxScale(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for _, kern := range kernelsForCPU() {
		e := newEngine(1, kern)
		require.True(t, math.IsInf(float64(e.Max(nil)), -1), kern.name)
		for _, n := range vecLengths[1:] {
			x := randSlice(r, n)
			for at := range n {
				y := append([]float32(nil), x...)
				y[at] = 5
				require.Equal(t, float32(5), e.Max(y), "%s n=%d max at %d", kern.name, n, at)
				y[at] = float32(math.NaN())
				require.True(t, math.IsNaN(float64(e.Max(y))), "%s n=%d NaN at %d", kern.name, n, at)
			}
			want := make([]float32, n)
			for i, v := range x {
				want[i] = v * 0.37
			}
			e.Scale(x, 0.37)
			require.Equal(t, want, x, "%s n=%d", kern.name, n)
		}
	}
}

// TestVecMathShortSlices checks the documented panics on a caller's bug.
func TestVecMathShortSlices(t *testing.T) {
	e := New(1)
	require.PanicsWithValue(t, "kernels: ExpSum with len(dst)=1 < len(src)=2", func() {
		e.ExpSum(make([]float32, 1), make([]float32, 2), 1, 0)
	})
	require.PanicsWithValue(t, "kernels: GELU with len(out)=3 len(dgelu)=2 < len(h)=3", func() {
		e.GELU(make([]float32, 3), make([]float32, 2), make([]float32, 3))
	})
}

// BenchmarkVecMath reports ns per element of ExpSum and GELU for each
// kernel, on a softmax row and an MLP activation's length.
func BenchmarkVecMath(b *testing.B) {
	r := rand.New(rand.NewPCG(25, 26))
	src := randSlice(r, 4096)
	dst, th := make([]float32, len(src)), make([]float32, len(src))
	for _, kern := range kernelsForCPU() {
		e := newEngine(1, kern)
		b.Run(kern.name+"/expsum", func(b *testing.B) {
			for b.Loop() {
				e.ExpSum(dst, src, 1, 1)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(src)), "ns/elem")
		})
		b.Run(kern.name+"/gelu", func(b *testing.B) {
			for b.Loop() {
				e.GELU(dst, th, src)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(src)), "ns/elem")
		})
	}
}

// TestLayerNorm checks every kernel the CPU runs, forward and backward,
// against the float64 formulas, on widths with and without whole vectors.
func TestLayerNorm(t *testing.T) {
	r := rand.New(rand.NewPCG(29, 30))
	for _, kern := range kernelsForCPU() {
		e := newEngine(1, kern)
		for _, sh := range []struct{ rows, d int }{{1, 1}, {3, 7}, {5, 16}, {4, 64}, {2, 40}, {7, 128}, {1, 48}} {
			t.Run(fmt.Sprintf("%s/%dx%d", kern.name, sh.rows, sh.d), func(t *testing.T) {
				rows, d := sh.rows, sh.d
				x, w, b := randSlice(r, rows*d), randSlice(r, d), randSlice(r, d)
				for i := range x {
					x[i] = x[i]*3 + 0.5 // not centred
				}
				out, mean, rstd := make([]float32, rows*d), make([]float32, rows), make([]float32, rows)
				e.LayerNorm(out, mean, rstd, x, w, b, d, 1e-5)

				dout := randSlice(r, rows*d)
				dx, dw, db := randSlice(r, rows*d), randSlice(r, d), randSlice(r, d)
				wantDX, wantDW, wantDB := to64(dx), to64(dw), to64(db)
				e.LayerNormBackward(dx, dw, db, dout, x, mean, rstd, w, d)

				for i := range rows {
					row := to64(x[i*d : (i+1)*d])
					var mu, v float64
					for _, xv := range row {
						mu += xv / float64(d)
					}
					for _, xv := range row {
						v += (xv - mu) * (xv - mu) / float64(d)
					}
					rs := 1 / math.Sqrt(v+1e-5)
					require.InDelta(t, mu, float64(mean[i]), 1e-5*max(1, math.Abs(mu)), "mean %d", i)
					require.InEpsilon(t, rs, float64(rstd[i]), 1e-5, "rstd %d", i)
					var sg, sgx float64
					xhat := make([]float64, d)
					for j, xv := range row {
						xhat[j] = (xv - mu) * rs
						g := float64(dout[i*d+j])
						want := xhat[j]*float64(w[j]) + float64(b[j])
						require.InDelta(t, want, float64(out[i*d+j]), 1e-5*max(1, math.Abs(want)), "out %d,%d", i, j)
						sg += g * float64(w[j])
						sgx += g * float64(w[j]) * xhat[j]
						wantDW[j] += g * xhat[j]
						wantDB[j] += g
					}
					for j := range row {
						g := float64(dout[i*d+j]) * float64(w[j])
						wantDX[i*d+j] += rs * (g - sg/float64(d) - xhat[j]*sgx/float64(d))
					}
				}
				requireNear(t, wantDX, dx, 1e-5)
				requireNear(t, wantDW, dw, 1e-5)
				requireNear(t, wantDB, db, 1e-5)
			})
		}
	}
}

func to64(s []float32) []float64 {
	out := make([]float64, len(s))
	for i, v := range s {
		out[i] = float64(v)
	}
	return out
}

// requireNear checks got against want to tol relative (absolute below 1).
func requireNear(t *testing.T, want []float64, got []float32, tol float64) {
	t.Helper()
	for i := range want {
		require.InDelta(t, want[i], float64(got[i]), tol*max(1, math.Abs(want[i])), "element %d", i)
	}
}

// TestLayerNormBadShapes checks the documented panics on a caller's bug.
func TestLayerNormBadShapes(t *testing.T) {
	e := New(1)
	f := make([]float32, 8)
	require.PanicsWithValue(t, "kernels: LayerNorm of len(x)=8 in rows of 3", func() { e.LayerNorm(f, f, f, f, f, f, 3, 1e-5) })
	require.PanicsWithValue(t, "kernels: LayerNormBackward of len(x)=8 in rows of 0", func() { e.LayerNormBackward(f, f, f, f, f, f, f, f, 0) })
	require.Panics(t, func() { e.LayerNorm(f[:4], f, f, f, f, f, 4, 1e-5) })
}
