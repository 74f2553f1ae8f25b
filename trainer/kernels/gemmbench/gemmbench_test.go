package gemmbench

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/kernels"
)

func TestBenchKernels(t *testing.T) {
	avail, bf16 := kernels.Available(), kernels.AvailableBF16()
	def, err := Kernels(nil)
	require.NoError(t, err)
	simdBF16 := bf16[:len(bf16)-1]
	if len(avail) > 1 {
		require.Equal(t, append(avail[:len(avail)-1], simdBF16...), def, "every SIMD kernel, fp32 then bf16, not the portable ones")
	} else {
		require.Equal(t, append(avail, simdBF16...), def)
	}
	got, err := Kernels([]string{"go-6x16"})
	require.NoError(t, err)
	require.Equal(t, []string{"go-6x16"}, got)
	_, err = Kernels([]string{"neon-8x8"})
	require.ErrorContains(t, err, "neon-8x8: this CPU runs only")
}
