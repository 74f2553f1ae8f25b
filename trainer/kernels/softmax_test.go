package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// softmaxSizes are heads' contexts with and without whole vectors and multiples of 16.
var softmaxSizes = []int{0, 1, 5, 8, 15, 16, 17, 31, 33, 64, 100, 128, 130}

// causalScores returns a t×t matrix of random scores, NaN above the diagonal: what is
// there must not matter.
func causalScores(r *rand.Rand, t int) []float32 {
	s := randSlice(r, t*t)
	for i := range t {
		for j := i + 1; j < t; j++ {
			s[i*t+j] = float32(math.NaN())
		}
	}
	return s
}

// TestCausalSoftmax checks CausalSoftmax of every kernel the CPU runs bit for bit against
// the Engine's Max, ExpSum and Scale in turn on the padded rows, and within 1e-6 of a
// float64 softmax.
func TestCausalSoftmax(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	const scale = 0.37
	for _, kern := range kernelsForCPU() {
		e := newEngine(1, kern)
		for _, n := range softmaxSizes {
			t.Run(fmt.Sprintf("%s/t=%d", kern.name, n), func(t *testing.T) {
				scores := causalScores(r, n)
				want := append([]float32(nil), scores...)
				for i := range n {
					row := want[i*n : (i+1)*n]
					span := row[:min((i+softmaxVector)/softmaxVector*softmaxVector, n)]
					for j := i + 1; j < len(span); j++ {
						span[j] = float32(math.Inf(-1))
					}
					composedSoftmax(e, span, scale)
					clear(row[i+1:])
					exact := softmax64(scores[i*n:i*n+i+1], scale)
					for j, w := range exact {
						require.InDelta(t, w, float64(row[j]), 1e-6, "row %d col %d", i, j)
					}
				}
				got := append([]float32(nil), scores...)
				e.CausalSoftmax(got, n, scale)
				require.Equal(t, want, got)
			})
		}
	}
}

// softmax64 is softmax(scale·x) in float64.
func softmax64(x []float32, scale float64) []float64 {
	mx, sum := math.Inf(-1), 0.0
	for _, v := range x {
		mx = max(mx, scale*float64(v))
	}
	out := make([]float64, len(x))
	for j, v := range x {
		out[j] = math.Exp(scale*float64(v) - mx)
		sum += out[j]
	}
	for j := range out {
		out[j] /= sum
	}
	return out
}

// TestCausalSoftmaxBackward checks CausalSoftmaxBackward of every kernel the CPU runs bit
// for bit against plain loops in the documented order, with NaN above the diagonal of dp.
func TestCausalSoftmaxBackward(t *testing.T) {
	r := rand.New(rand.NewPCG(53, 54))
	const scale = 0.37
	for _, kern := range kernelsForCPU() {
		e := newEngine(1, kern)
		for _, n := range softmaxSizes {
			t.Run(fmt.Sprintf("%s/t=%d", kern.name, n), func(t *testing.T) {
				p := causalScores(r, n)
				e.CausalSoftmax(p, n, 1)
				dp := causalScores(r, n)
				want := make([]float32, n*n)
				for i := range n {
					pr, dr := p[i*n:i*n+i+1], dp[i*n:i*n+i+1]
					var part [8]float32
					for k := range len(pr) / 8 * 8 {
						part[k%8] += float32(pr[k] * dr[k])
					}
					for k := len(pr) / 8 * 8; k < len(pr); k++ {
						part[0] += float32(pr[k] * dr[k])
					}
					s := ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]))
					for j := range pr {
						want[i*n+j] = float32(scale*pr[j]) * (dr[j] - s)
					}
				}
				e.CausalSoftmaxBackward(dp, p, n, scale)
				require.Equal(t, want, dp[:n*n])
			})
		}
	}
}

// TestCausalSoftmaxBadShapes checks the documented panics on a caller's bug.
func TestCausalSoftmaxBadShapes(t *testing.T) {
	e := New(1)
	require.PanicsWithValue(t, "kernels: CausalSoftmax t=3 with len=8 and 8", func() {
		e.CausalSoftmax(make([]float32, 8), 3, 1)
	})
	require.PanicsWithValue(t, "kernels: CausalSoftmaxBackward t=2 with len=4 and 3", func() {
		e.CausalSoftmaxBackward(make([]float32, 4), make([]float32, 3), 2, 1)
	})
}

// BenchmarkCausalSoftmax times CausalSoftmax and CausalSoftmaxBackward on a head of the
// bench model (context 128), for each kernel the CPU runs.
func BenchmarkCausalSoftmax(b *testing.B) {
	r := rand.New(rand.NewPCG(55, 56))
	const n = 128
	for _, kern := range kernelsForCPU() {
		e := newEngine(1, kern)
		scores, p, dp := randSlice(r, n*n), randSlice(r, n*n), randSlice(r, n*n)
		e.CausalSoftmax(p, n, 1)
		b.Run("forward/"+kern.name, func(b *testing.B) {
			for b.Loop() {
				e.CausalSoftmax(scores, n, 0.17)
			}
		})
		b.Run("backward/"+kern.name, func(b *testing.B) {
			for b.Loop() {
				e.CausalSoftmaxBackward(dp, p, n, 0.17)
			}
		})
	}
}
