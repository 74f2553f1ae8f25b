package resume

import (
	"fmt"
	"strings"
	"sync/atomic"
)

// StopKind says why a run is asked to checkpoint and stop; kinds combine as bits.
type StopKind uint32

const (
	// StopRequeue is SIGUSR1 or SIGUSR2 (SLURM's --signal warning before the time limit):
	// checkpoint, then exit with a status that asks to be requeued.
	StopRequeue StopKind = 1 << iota
	// StopTerminate is SIGTERM: checkpoint if that can be done within the grace period, then exit
	// as terminated.
	StopTerminate
)

// String names the kinds set in k, e.g. "requeue+terminate"; "none" for 0.
func (k StopKind) String() string {
	var names []string
	if k&StopRequeue != 0 {
		names = append(names, "requeue")
	}
	if k&StopTerminate != 0 {
		names = append(names, "terminate")
	}
	if rest := k &^ (StopRequeue | StopTerminate); rest != 0 {
		names = append(names, fmt.Sprintf("0x%x", uint32(rest)))
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, "+")
}

// Stop is a request to checkpoint at the next step boundary and stop, made from any goroutine (a
// signal handler) and read by a Checkpointer at every step boundary. The zero value holds no
// request; requests only accumulate.
type Stop struct{ kinds atomic.Uint32 }

// Request adds k to the pending request.
func (s *Stop) Request(k StopKind) { s.kinds.Or(uint32(k)) }

// Pending returns the kinds requested so far (0: none); a nil Stop has none.
func (s *Stop) Pending() StopKind {
	if s == nil {
		return 0
	}
	return StopKind(s.kinds.Load())
}

// StoppedError is what AfterStep returns, on every rank alike, once a requested stop is
// checkpointed: the run stopped after Step with its state saved in Checkpoint.
type StoppedError struct {
	Step       int64
	Kind       StopKind // the requests of every rank combined
	Checkpoint string   // the step directory saved
}

// Error says what was saved and why the run stopped.
func (e *StoppedError) Error() string {
	return fmt.Sprintf("checkpointed step %d to %s and stopped (%s requested)", e.Step, e.Checkpoint, e.Kind)
}
