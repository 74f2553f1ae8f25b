//go:build amd64 && !purego

package kernels

//go:generate go run ./internal/gen -set softmax -out softmax_amd64.s -stubs softmax_amd64_stub.go -pkg kernels

import "unsafe"

// softmaxRowFunc returns the row softmax of CausalSoftmax beside the GEMM micro-kernel
// kern: one assembly call per row for the vector kernels, the same bits as the Engine's
// Max, ExpSum and Scale in turn (composedSoftmax) on the padded row, which the others use.
func softmaxRowFunc(kern *microKernel) func(e *Engine, r []float32, live int, scale float32) {
	switch kern.name {
	case "avx512-12x32":
		long := vecSoftmax(softmaxAVX512, 16)
		return func(e *Engine, r []float32, live int, scale float32) {
			n := softmaxSpan(live, len(r))
			if live == 0 || n%16 != 0 || n > 16*softmaxShortVectors {
				paddedSoftmax(e, r, live, scale, long)
				return
			}
			softmaxShortAVX512(unsafe.SliceData(r), live, n, scale)
			clear(r[n:])
		}
	case "avx2-fma-6x16":
		long := vecSoftmax(softmaxAVX2, 8)
		return func(e *Engine, r []float32, live int, scale float32) {
			paddedSoftmax(e, r, live, scale, long)
		}
	}
	return func(e *Engine, r []float32, live int, scale float32) {
		paddedSoftmax(e, r, live, scale, composedSoftmax)
	}
}

// softmaxShortVectors is the longest row, in vectors, softmaxShortAVX512 takes (see
// softmaxMaxVectors in internal/gen).
const softmaxShortVectors = 8

// vecSoftmax runs asm on rows of whole vectors of lanes floats and composedSoftmax on
// the others.
func vecSoftmax(asm func(x *float32, n int, scale float32), lanes int) func(e *Engine, x []float32, scale float32) {
	return func(e *Engine, x []float32, scale float32) {
		if len(x) == 0 || len(x)%lanes != 0 {
			composedSoftmax(e, x, scale)
			return
		}
		asm(unsafe.SliceData(x), len(x), scale)
	}
}

// softmaxBackwardFunc returns the row of CausalSoftmaxBackward beside the GEMM
// micro-kernel kern (d[:live] from p[:live], d[live:] zero): in assembly for the vector
// kernels, with goSoftmaxBackward's bits.
func softmaxBackwardFunc(kern *microKernel) func(d, p []float32, live int, scale float32) {
	switch kern.name {
	case "avx512-12x32":
		part := vecSoftmaxBackward(softmaxBackwardAVX512, 16)
		return func(d, p []float32, live int, scale float32) {
			if live == 0 || len(d)%16 != 0 || len(p) < len(d) || live > len(d) {
				part(d, p, live, scale)
				return
			}
			softmaxBackwardWholeAVX512(unsafe.SliceData(d), unsafe.SliceData(p), live, len(d), scale)
		}
	case "avx2-fma-6x16":
		return vecSoftmaxBackward(softmaxBackwardAVX2, 8)
	}
	return goSoftmaxBackward
}

// vecSoftmaxBackward runs asm on the row's live elements rounded up to whole vectors of
// lanes floats, as far as d and p have them, goSoftmaxUpdate on the live ones past those,
// and clears d past live.
func vecSoftmaxBackward(asm func(d, p *float32, live, n int, scale float32) float32, lanes int) func(d, p []float32, live int, scale float32) {
	return func(d, p []float32, live int, scale float32) {
		n := min((live+lanes-1)/lanes*lanes, min(len(d), len(p))/lanes*lanes)
		if live == 0 || max(n, live) > min(len(d), len(p)) {
			goSoftmaxBackward(d, p, live, scale)
			return
		}
		s := asm(unsafe.SliceData(d), unsafe.SliceData(p), live, n, scale)
		if n < live {
			goSoftmaxUpdate(d[n:live], p[n:live], s, scale)
		}
		clear(d[live:])
	}
}
