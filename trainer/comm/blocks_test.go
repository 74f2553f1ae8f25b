package comm

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/testutil"
)

// equalBounds splits size blocks of m elements.
func equalBounds(size, m int) []int {
	b := make([]int, size+1)
	for k := range b {
		b[k] = k * m
	}
	return b
}

// partBounds are the bounds of part [a, b) of a buffer split into size
// slices of m elements: block k is part's overlap with slice k, offset
// from a.
func partBounds(size, m, a, b int) []int {
	bounds := make([]int, size+1)
	for k := range bounds {
		bounds[k] = min(max(k*m, a), b) - a
	}
	return bounds
}

// TestPartsGiveTheWholesBits reduce-scatters a buffer part by part into
// each member's slice (ReduceScatterAddV), and gathers it back part by
// part (AllGatherV), over parts that end inside a slice, span several,
// or lie in one: the slices get the bits of one ReduceScatterWiden of the
// whole, added to what they held, and the gathers the whole buffer.
func TestPartsGiveTheWholesBits(t *testing.T) {
	const m = 40_000 // each member's slice
	tests := []struct {
		size  int
		cuts  []int // ends of the parts, the last being size*m
		tcp   bool
		scale float64
	}{
		{1, []int{7, m}, false, 1},
		{2, []int{10, m - 3, m, m + 1, 2 * m}, false, 1},
		{3, []int{1, 2*m + 5, 3 * m}, false, 1e-3},
		{4, []int{m / 2, m / 2, 3 * m, 4 * m}, true, 1}, // an empty part too
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%d members", tc.size), func(t *testing.T) {
			worlds := startWorld(t, max(tc.size, 2), func(c *Config) { c.TCPOnly = tc.tcp })
			in, _ := inputs(tc.size, m*tc.size, 5)
			want, got := make([][]float64, tc.size), make([][]float64, tc.size)
			gathered := make([][]float32, tc.size)
			testutil.RequireRanks(t, testutil.OnRanks(tc.size, func(r int) error {
				g := worlds[r].All()
				if tc.size == 1 {
					var err error
					if g, err = worlds[r].Group([]int{r}); err != nil {
						return err
					}
				}
				want[r] = make([]float64, m)
				if err := g.ReduceScatterWiden(in[r], want[r]); err != nil {
					return err
				}
				got[r] = make([]float64, m)
				for i := range got[r] {
					got[r][i] = tc.scale * float64(i%7)
				}
				start := append([]float64(nil), got[r]...)
				a := 0
				for _, b := range tc.cuts {
					bounds := partBounds(tc.size, m, a, b)
					mine := got[r][min(max(a-r*m, 0), m):min(max(b-r*m, 0), m)]
					if err := g.ReduceScatterAddV(in[r][a:b], bounds, mine); err != nil {
						return err
					}
					a = b
				}
				for i := range want[r] {
					want[r][i] = start[i] + want[r][i]
				}
				gathered[r] = make([]float32, m*tc.size)
				copy(gathered[r][r*m:], in[0][r*m:(r+1)*m])
				a = 0
				for _, b := range tc.cuts {
					if err := g.AllGatherV(gathered[r][a:b], partBounds(tc.size, m, a, b)); err != nil {
						return err
					}
					a = b
				}
				return nil
			}))
			for r := range tc.size {
				require.Equal(t, -1, firstDiff64(want[r], got[r]), "member %d: the slice has the whole's bits", r)
				require.True(t, equalBits(in[0], gathered[r]), "member %d gathered the whole", r)
			}
		})
	}
}

func TestBoundsAreChecked(t *testing.T) {
	g, err := startWorld(t, 2, nil)[0].Group([]int{0})
	require.NoError(t, err)
	for _, bounds := range [][]int{{0}, {1, 4}, {0, 3}, {0, 5}} {
		require.Error(t, g.AllGatherV(make([]float32, 4), bounds), "%v", bounds)
		require.Error(t, g.ReduceScatterAddV(make([]float32, 4), bounds, make([]float64, 4)), "%v", bounds)
	}
	require.Error(t, g.ReduceScatterAddV(make([]float32, 4), []int{0, 4}, make([]float64, 3)), "out is not the block")
	out := []float64{1, 2}
	require.NoError(t, g.ReduceScatterAddV([]float32{0.5, float32(math.Copysign(0, -1))}, []int{0, 2}, out))
	require.Equal(t, []float64{1.5, 2}, out)
}
