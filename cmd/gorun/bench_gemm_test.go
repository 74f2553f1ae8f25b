package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/kernels"
)

// TestBenchGemmRowsNameTheirKernel runs `gorun bench gemm` on tiny
// products with every kernel the CPU runs, fp32 and bf16, and checks that
// each kernel gets its own peak row and that every row names its kernel
// and precision.
func TestBenchGemmRowsNameTheirKernel(t *testing.T) {
	avail := allKernels()
	bf16 := kernels.AvailableBF16()
	code, stdout, stderr := run(t, nil, "bench", "gemm", "--threads", "1", "--sizes", "8", "--shapes", "4x5x6:tn",
		"--runs", "1", "--json", "--kernels", strings.Join(avail, ","))
	require.Zero(t, code, stderr)
	var rows []gemmRow
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var r gemmRow
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		rows = append(rows, r)
	}
	require.Len(t, rows, 3*len(avail), "a peak row and two products per kernel")
	for i, name := range avail {
		peak, square, shape := rows[3*i], rows[3*i+1], rows[3*i+2]
		require.True(t, peak.Peak, name)
		require.Positive(t, peak.GFLOPS, name)
		require.Equal(t, gemmShape{M: 8, N: 8, K: 8}, square.gemmShape)
		require.Equal(t, gemmShape{M: 4, N: 5, K: 6, TransA: true}, shape.gemmShape)
		precision := map[bool]string{false: "fp32", true: "bf16"}[slices.Contains(bf16, name)]
		for _, r := range []gemmRow{peak, square, shape} {
			require.Equal(t, name, r.Kernel)
			require.Equal(t, precision, r.Precision, name)
		}
	}
}

func TestBenchKernels(t *testing.T) {
	avail, bf16 := kernels.Available(), kernels.AvailableBF16()
	def, err := benchKernels(nil)
	require.NoError(t, err)
	simdBF16 := bf16[:len(bf16)-1]
	if len(avail) > 1 {
		require.Equal(t, append(avail[:len(avail)-1], simdBF16...), def, "every SIMD kernel, fp32 then bf16, not the portable ones")
	} else {
		require.Equal(t, append(avail, simdBF16...), def)
	}
	got, err := benchKernels([]string{"go-6x16"})
	require.NoError(t, err)
	require.Equal(t, []string{"go-6x16"}, got)
	_, err = benchKernels([]string{"neon-8x8"})
	require.ErrorContains(t, err, "--kernels=neon-8x8: this CPU runs only")
}
