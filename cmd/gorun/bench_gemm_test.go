package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/kernels"
	"github.com/gorun/gorun/trainer/kernels/gemmbench"
)

// TestBenchGemmRowsNameTheirKernel runs `gorun bench gemm` on tiny
// products with every kernel the CPU runs, fp32 and bf16, and checks that
// each kernel gets its own peak row and that every row names its kernel
// and precision.
func TestBenchGemmRowsNameTheirKernel(t *testing.T) {
	avail := gemmbench.AllKernels()
	bf16 := kernels.AvailableBF16()
	code, stdout, stderr := run(t, nil, "bench", "gemm", "--threads", "1", "--sizes", "8", "--shapes", "4x5x6:tn",
		"--runs", "1", "--json", "--kernels", strings.Join(avail, ","))
	require.Zero(t, code, stderr)
	var rows []gemmbench.Row
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var r gemmbench.Row
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		rows = append(rows, r)
	}
	require.Len(t, rows, 3*len(avail), "a peak row and two products per kernel")
	for i, name := range avail {
		peak, square, shape := rows[3*i], rows[3*i+1], rows[3*i+2]
		require.True(t, peak.Peak, name)
		require.Positive(t, peak.GFLOPS, name)
		require.Equal(t, gemmbench.Shape{M: 8, N: 8, K: 8}, square.Shape)
		require.Equal(t, gemmbench.Shape{M: 4, N: 5, K: 6, TransA: true}, shape.Shape)
		precision := map[bool]string{false: "fp32", true: "bf16"}[slices.Contains(bf16, name)]
		for _, r := range []gemmbench.Row{peak, square, shape} {
			require.Equal(t, name, r.Kernel)
			require.Equal(t, precision, r.Precision, name)
		}
	}
}

// A kernel this CPU does not run is a usage error that names the flag.
func TestBenchGemmUnknownKernel(t *testing.T) {
	code, _, stderr := run(t, nil, "bench", "gemm", "--kernels", "neon-8x8")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "bench gemm: --kernels=neon-8x8: this CPU runs only")
}
