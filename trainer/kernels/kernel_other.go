//go:build !amd64 || purego

package kernels

// kernelsForCPU lists every micro-kernel this CPU runs: the portable one.
func kernelsForCPU() []*microKernel { return []*microKernel{goKernel()} }
