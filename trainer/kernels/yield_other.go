//go:build !linux

package kernels

import "runtime"

// yieldCPU offers the processor to other goroutines; on Linux it is
// sched_yield, which offers the CPU to other processes too.
func yieldCPU() { runtime.Gosched() }
