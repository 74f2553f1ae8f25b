package proc

import (
	"fmt"
	"os/exec"

	"golang.org/x/sys/unix"
)

// startWithCPUs starts cmd with CPU affinity cpus (none: inherited). The
// calling goroutine must hold its OS thread (runtime.LockOSThread): the
// child inherits the affinity of the thread that forks it, so that
// thread's is set for the fork and restored after it, and the process
// runs on cpus from its first instruction, every thread it makes too.
// dirty says the thread's affinity could not be restored: the caller must
// then end its goroutine still locked, so that the thread ends with it.
func startWithCPUs(cmd *exec.Cmd, cpus []int) (dirty bool, err error) {
	if len(cpus) == 0 {
		return false, cmd.Start()
	}
	var want, old unix.CPUSet
	for _, c := range cpus {
		if c < 0 || c >= len(want)*64 {
			return false, fmt.Errorf("CPU %d out of range", c)
		}
		want.Set(c)
	}
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return false, fmt.Errorf("read CPU affinity: %w", err)
	}
	if err := unix.SchedSetaffinity(0, &want); err != nil {
		return false, fmt.Errorf("set CPU affinity to %v: %w", cpus, err)
	}
	err = cmd.Start()
	return unix.SchedSetaffinity(0, &old) != nil, err
}

// CPUsOf returns the CPU affinity of process pid (0: the caller's thread),
// in increasing order.
func CPUsOf(pid int) ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(pid, &set); err != nil {
		return nil, fmt.Errorf("proc: CPU affinity of %d: %w", pid, err)
	}
	var cpus []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}
