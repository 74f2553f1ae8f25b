//go:build !amd64 || purego

package kernels

// kernelsForCPU lists every micro-kernel this CPU runs: the portable one.
func kernelsForCPU() []*microKernel { return []*microKernel{goKernel()} }

// bf16KernelsForCPU lists every bf16 GEMM kernel this CPU runs: the
// portable one.
func bf16KernelsForCPU() []*bf16Kernel { return []*bf16Kernel{goBF16Kernel()} }
