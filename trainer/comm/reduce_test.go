package comm

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWiden: every float32 becomes the float64 a zeroed float64
// accumulator holds once it is added, -0 included.
func TestWiden(t *testing.T) {
	negZero := float32(math.Copysign(0, -1))
	tests := []struct {
		name string
		in   float32
		want float64
	}{
		{"one", 1, 1},
		{"negative", -2.5, -2.5},
		{"+0", 0, 0},
		{"-0 becomes +0", negZero, 0},
		{"smallest subnormal", math.SmallestNonzeroFloat32, math.SmallestNonzeroFloat32},
		{"largest", math.MaxFloat32, math.MaxFloat32},
		{"-Inf", float32(math.Inf(-1)), math.Inf(-1)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var acc float64 // what the trainer's zeroed float64 sum holds
			acc += float64(tc.in)
			got := make([]float64, 1)
			Widen(got, []float32{tc.in})
			require.Equal(t, math.Float64bits(tc.want), math.Float64bits(got[0]))
			require.Equal(t, math.Float64bits(acc), math.Float64bits(got[0]))

			sum := make([]float64, 1)
			addWide(sum, []float32{tc.in}, []float64{math.Copysign(0, -1)})
			require.Equal(t, math.Float64bits(acc+math.Copysign(0, -1)), math.Float64bits(sum[0]), "added to a received -0")
		})
	}
	nan := make([]float64, 1)
	Widen(nan, []float32{float32(math.NaN())})
	require.True(t, math.IsNaN(nan[0]))
}
