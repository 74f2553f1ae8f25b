package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSumSquares checks SumSquares against a float64 sum in index order
// (within rounding) and its bits against the same sum on 1 to 3 threads.
func TestSumSquares(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 36))
	for _, n := range []int{0, 1, 7, 8, 9, 100, sumSquaresChunk, sumSquaresChunk + 1, 3*sumSquaresChunk + 13} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			x := randSlice(r, n)
			var want float64
			for _, v := range x {
				want += float64(v) * float64(v)
			}
			one := New(1).SumSquares(x)
			require.InEpsilon(t, want+1, one+1, 1e-12)
			for _, threads := range []int{2, 3} {
				require.Equal(t, math.Float64bits(one), math.Float64bits(New(threads).SumSquares(x)), "threads=%d", threads)
			}
		})
	}
	require.Equal(t, 25.0, New(2).SumSquares([]float32{3, -4, 0}))
	require.True(t, math.IsInf(New(2).SumSquares([]float32{1, float32(math.Inf(-1))}), 1))
}

func TestForChunks(t *testing.T) {
	for _, tc := range []struct {
		n, chunk int
		want     [][2]int
	}{
		{0, 4, nil},
		{3, 4, [][2]int{{0, 3}}},
		{8, 4, [][2]int{{0, 4}, {4, 8}}},
		{9, 4, [][2]int{{0, 4}, {4, 8}, {8, 9}}},
	} {
		t.Run(fmt.Sprintf("n=%d/chunk=%d", tc.n, tc.chunk), func(t *testing.T) {
			got := make([][2]int, len(tc.want))
			New(2).ForChunks(tc.n, tc.chunk, func(lo, hi int) { got[lo/tc.chunk] = [2]int{lo, hi} })
			if tc.want == nil {
				require.Empty(t, got)
				return
			}
			require.Equal(t, tc.want, got)
		})
	}
	require.PanicsWithValue(t, "kernels: ForChunks with chunk < 1", func() { New(1).ForChunks(3, 0, func(int, int) {}) })
}

// BenchmarkSumSquares is SumSquares on the bench model's 842496
// parameters on one and two threads.
func BenchmarkSumSquares(b *testing.B) {
	x := randSlice(rand.New(rand.NewPCG(37, 38)), 842496)
	for _, threads := range []int{1, 2} {
		e := New(threads)
		b.Run(fmt.Sprintf("threads=%d", threads), func(b *testing.B) {
			for b.Loop() {
				e.SumSquares(x)
			}
		})
	}
}
