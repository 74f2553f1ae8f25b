//go:build !amd64 || purego

package kernels

// bestKernel is the fastest micro-kernel the CPU runs: the portable one.
func bestKernel() *microKernel { return goKernel() }

// kernelsForCPU lists every micro-kernel this CPU runs, for the tests.
func kernelsForCPU() []*microKernel { return []*microKernel{goKernel()} }
