package kernels

import "golang.org/x/sys/unix"

// yieldCPU offers the CPU to any other runnable thread, of this process
// or another (sched_yield), and returns at once when there is none: a
// spinning team worker costs others little on an oversubscribed machine.
func yieldCPU() { _, _, _ = unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
