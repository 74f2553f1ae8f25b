package proc

import (
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Result says how a process ended.
type Result struct {
	// PID is the process ID the process had.
	PID int
	// ExitCode is the exit status, or 128+N for a death by signal N, as a shell reports it.
	// It is -1 when the process could not be reaped (see Err).
	ExitCode int
	// Signal is the signal that killed the process; 0 when it exited.
	Signal syscall.Signal
	// Started is when the process started; Ended is when its group leader ended.
	Started, Ended time.Time
	// Err is non-nil when reaping the process failed, or copying its output to a Spec writer
	// failed or was cut short (exec.ErrWaitDelay). ExitCode and Signal stay valid in the second case.
	Err error
}

// Success reports whether the process exited with status 0. It ignores Err: a process whose output
// could not be fully copied still succeeded.
func (r Result) Success() bool {
	return r.ExitCode == 0 && r.Signal == 0
}

// String describes the end of the process as "exit status 3" or "killed by SIGKILL (exit 137)".
func (r Result) String() string {
	if r.Signal != 0 {
		name := unix.SignalName(r.Signal)
		if name == "" {
			name = fmt.Sprintf("signal %d", int(r.Signal))
		}
		return fmt.Sprintf("killed by %s (exit %d)", name, r.ExitCode)
	}
	if r.ExitCode < 0 {
		return fmt.Sprintf("unknown end: %v", r.Err)
	}
	return fmt.Sprintf("exit status %d", r.ExitCode)
}

// resultFromStatus fills the exit code and signal of r from a wait status.
func resultFromStatus(r *Result, ws syscall.WaitStatus) {
	switch {
	case ws.Signaled():
		r.Signal = ws.Signal()
		r.ExitCode = 128 + int(r.Signal)
	case ws.Exited():
		r.ExitCode = ws.ExitStatus()
	default:
		r.ExitCode = -1
	}
}
