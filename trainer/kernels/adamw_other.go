//go:build !amd64 || purego

package kernels

// adamwKernel returns the AdamW kernel of kern's instruction set: the
// portable goAdamW on this build.
func adamwKernel(*microKernel) adamwFunc { return goAdamW }

// adamwISA names the instruction set AdamW runs with beside the GEMM
// micro-kernel kern: "go" on this build.
func adamwISA(*microKernel) string { return "go" }
