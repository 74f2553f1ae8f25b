//go:build !linux

package kernels

import "time"

// threadCPU is the CPU time the calling OS thread has used; ok is false
// when the clock cannot be read, as everywhere but Linux.
func threadCPU() (d time.Duration, ok bool) { return 0, false }
