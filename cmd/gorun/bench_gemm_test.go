package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/kernels"
)

// TestBenchGemmRowsNameTheirKernel runs `gorun bench gemm` on tiny
// products with every kernel the CPU runs and checks that each kernel gets
// its own peak row and that every row names its kernel.
func TestBenchGemmRowsNameTheirKernel(t *testing.T) {
	avail := kernels.Available()
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
		for _, r := range []gemmRow{peak, square, shape} {
			require.Equal(t, name, r.Kernel)
		}
	}
}

func TestBenchKernels(t *testing.T) {
	avail := kernels.Available()
	def, err := benchKernels(nil)
	require.NoError(t, err)
	if len(avail) > 1 {
		require.Equal(t, avail[:len(avail)-1], def, "every SIMD kernel, not the portable one")
	} else {
		require.Equal(t, avail, def)
	}
	got, err := benchKernels([]string{"go-6x16"})
	require.NoError(t, err)
	require.Equal(t, []string{"go-6x16"}, got)
	_, err = benchKernels([]string{"neon-8x8"})
	require.ErrorContains(t, err, "--kernels=neon-8x8: this CPU runs only")
}
