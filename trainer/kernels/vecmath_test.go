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

// TestGELU checks every kernel the CPU runs against the float64 formula
// with math.Tanh, on inputs from deep negative to saturated positive.
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
				out, th := make([]float32, n), make([]float32, n)
				e.GELU(out, th, h)
				for i, v := range h {
					x := float64(v)
					tw := math.Tanh(geluC * (x + 0.044715*x*x*x))
					require.InDelta(t, tw, float64(th[i]), 1e-6, "tanh of element %d (%v)", i, v)
					require.InDelta(t, 0.5*x*(1+tw), float64(out[i]), 1e-6*max(1, math.Abs(x)), "element %d (%v)", i, v)
				}
			})
		}
	}
}

// TestVecMathShortSlices checks the documented panics on a caller's bug.
func TestVecMathShortSlices(t *testing.T) {
	e := New(1)
	require.PanicsWithValue(t, "kernels: ExpSum with len(dst)=1 < len(src)=2", func() {
		e.ExpSum(make([]float32, 1), make([]float32, 2), 1, 0)
	})
	require.PanicsWithValue(t, "kernels: GELU with len(out)=3 len(th)=2 < len(h)=3", func() {
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
