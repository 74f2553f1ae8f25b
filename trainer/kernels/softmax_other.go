//go:build !amd64 || purego

package kernels

// softmaxRowFunc returns the row softmax of CausalSoftmax beside the GEMM micro-kernel
// kern: the Engine's Max, ExpSum and Scale on this build.
func softmaxRowFunc(*microKernel) func(e *Engine, r []float32, live int, scale float32) {
	return func(e *Engine, r []float32, live int, scale float32) {
		paddedSoftmax(e, r, live, scale, composedSoftmax)
	}
}

// softmaxBackwardFunc returns the row of CausalSoftmaxBackward beside the GEMM
// micro-kernel kern (d[:live] from p[:live], d[live:] zero): the portable one on this
// build.
func softmaxBackwardFunc(*microKernel) func(d, p []float32, live int, scale float32) {
	return goSoftmaxBackward
}
