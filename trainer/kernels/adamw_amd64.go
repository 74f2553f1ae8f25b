//go:build amd64 && !purego

package kernels

//go:generate go run ./internal/gen -set optim -out adamw_amd64.s -stubs adamw_amd64_stub.go -pkg kernels

import "unsafe"

// adamwKernel returns the AdamW kernel of kern's instruction set (see
// adamwISA). Every one gives the same bits.
func adamwKernel(kern *microKernel) adamwFunc {
	switch adamwISA(kern) {
	case "avx512":
		return vecAdamW(adamwAVX512, 8)
	case "avx2":
		return vecAdamW(adamwAVX2, 4)
	}
	return goAdamW
}

// adamwISA names the instruction set AdamW runs with beside the GEMM
// micro-kernel kern: "avx512", "avx2" or "go".
func adamwISA(kern *microKernel) string {
	switch kern.name {
	case "avx512-12x32":
		return "avx512"
	case "avx2-fma-6x16":
		return "avx2"
	}
	return "go"
}

// vecAdamW is an adamwFunc that runs asm on the whole vectors of lanes
// float64 and goAdamW on the rest.
func vecAdamW(asm func(params, m, v, grads *float32, decay *bool, n int, c *float64), lanes int) adamwFunc {
	return func(params, m, v, grads []float32, decay []bool, s *AdamWStep) {
		n := len(params) / lanes * lanes
		if n > 0 {
			_, _, _ = m[n-1], v[n-1], grads[n-1]
			var d *bool
			if decay != nil {
				d = unsafe.SliceData(decay[:n])
			}
			table := adamwTable(s)
			asm(unsafe.SliceData(params), unsafe.SliceData(m), unsafe.SliceData(v), unsafe.SliceData(grads), d, n, &table[0])
		}
		var rest []bool
		if decay != nil {
			rest = decay[n:]
		}
		goAdamW(params[n:], m[n:], v[n:], grads[n:], rest, s)
	}
}

// adamwTable lays out s's constants for the assembly (see adamwConsts in
// internal/gen): each repeated 8 times, in that order.
func adamwTable(s *AdamWStep) [80]float64 {
	var t [80]float64
	for i, c := range []float64{s.LR, s.Beta1, 1 - s.Beta1, s.Beta2, 1 - s.Beta2, s.BC1, s.BC2, s.Eps, s.Shrink, s.Clip} {
		for l := range 8 {
			t[8*i+l] = c
		}
	}
	return t
}
