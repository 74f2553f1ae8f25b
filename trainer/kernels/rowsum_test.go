package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAddMul checks Add and Mul of every kernel the CPU runs against
// plain loops, bit for bit, with dst longer than src (its tail untouched).
func TestAddMul(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, kern := range kernelsForCPU() {
		e := newEngine(1, kern)
		for _, n := range append(vecLengths, 64, 65, 127, 1000) {
			t.Run(fmt.Sprintf("%s/n=%d", kern.name, n), func(t *testing.T) {
				dst, src := randSlice(r, n+3), randSlice(r, n)
				sum, prod := append([]float32(nil), dst...), append([]float32(nil), dst...)
				for i, v := range src {
					sum[i] += v
					prod[i] *= v
				}
				got := append([]float32(nil), dst...)
				e.Add(got, src)
				require.Equal(t, sum, got, "add")
				got = append(got[:0], dst...)
				e.Mul(got, src)
				require.Equal(t, prod, got, "mul")
			})
		}
	}
}

// TestSumRows checks SumRows of every kernel the CPU runs against the
// column sums in row order, bit for bit, on widths with and without whole
// vectors and blocks of vectors.
func TestSumRows(t *testing.T) {
	r := rand.New(rand.NewPCG(43, 44))
	for _, kern := range kernelsForCPU() {
		e := newEngine(1, kern)
		for _, cols := range []int{1, 7, 8, 9, 16, 24, 40, 64, 100, 128, 136, 384, 520} {
			for _, rows := range []int{0, 1, 3, 64} {
				t.Run(fmt.Sprintf("%s/%dx%d", kern.name, rows, cols), func(t *testing.T) {
					src, dst := randSlice(r, rows*cols), randSlice(r, cols+2)
					want := append([]float32(nil), dst...)
					for i := range rows {
						for j := range cols {
							want[j] += src[i*cols+j]
						}
					}
					e.SumRows(dst, src, cols)
					require.Equal(t, want, dst)
				})
			}
		}
	}
}

// TestRowSumBadShapes checks the documented panics on a caller's bug.
func TestRowSumBadShapes(t *testing.T) {
	e := New(1)
	f := make([]float32, 8)
	require.PanicsWithValue(t, "kernels: Add with len(dst)=2 < len(src)=8", func() { e.Add(f[:2], f) })
	require.PanicsWithValue(t, "kernels: Mul with len(dst)=2 < len(src)=8", func() { e.Mul(f[:2], f) })
	require.PanicsWithValue(t, "kernels: SumRows of len(src)=8 in rows of 3 into len(dst)=8", func() { e.SumRows(f, f, 3) })
	require.PanicsWithValue(t, "kernels: SumRows of len(src)=8 in rows of 0 into len(dst)=8", func() { e.SumRows(f, f, 0) })
	require.PanicsWithValue(t, "kernels: SumRows of len(src)=8 in rows of 4 into len(dst)=2", func() { e.SumRows(f[:2], f, 4) })
}
