package worker

import (
	"context"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorun/gorun/trainer/resume"
)

const (
	// termSaveTimeout is how long a SIGTERM waits for the next step
	// boundary and the save there before stopping without one: shorter
	// than gorun's default --term-timeout (30 s), after which gorun kills.
	termSaveTimeout = 20 * time.Second
	// duplicateSignalWindow is how close a second SIGTERM may follow the
	// first and still be the same one delivered twice (by SLURM to every
	// process of the step, and by gorun); a later one stops at once.
	duplicateSignalWindow = 2 * time.Second
)

// signalError is the cause of a worker's context when a stop signal came.
type signalError struct{ sig syscall.Signal }

func (e signalError) Error() string { return "stopped by " + e.sig.String() }

// workerSignals is what the signals a worker gets have asked for so far.
type workerSignals struct {
	// ctx is cancelled, with a signalError cause, when the worker must
	// stop at once.
	ctx context.Context
	// stop holds the checkpoint-and-stop requests of SIGUSR1, SIGUSR2 and
	// SIGTERM, read at every step boundary.
	stop resume.Stop
	// saving is set once the trainer runs with checkpoints: from then on a
	// SIGTERM asks for a save first instead of stopping at once.
	saving atomic.Bool
	// terminated is set by the first SIGTERM.
	terminated atomic.Bool
	// term is closed by the first SIGTERM that asks for a save: a worker
	// that cannot reach a step boundary (its world broke and it awaits the
	// next round) stops at once instead.
	term chan struct{}
}

// watchSignals starts watching the signals the agent forwards: SIGUSR1
// and SIGUSR2 request a checkpoint and a stop; SIGTERM does too once the
// trainer runs (before that, it stops at once), and cancels ctx if the
// save has not ended the run within saveTimeout; SIGINT, SIGHUP and a
// second SIGTERM (duplicate or more after the first; a closer one is the
// same signal delivered twice) cancel ctx at once. The returned func
// stops watching and cancels ctx; call it once.
func watchSignals(parent context.Context, saveTimeout, duplicate time.Duration) (*workerSignals, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	ws := &workerSignals{ctx: ctx, term: make(chan struct{})}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var deadline <-chan time.Time
		var firstTerm time.Time
		for {
			select {
			case s := <-sigs:
				sig := s.(syscall.Signal)
				switch {
				case sig == syscall.SIGUSR1 || sig == syscall.SIGUSR2:
					ws.stop.Request(resume.StopRequeue)
				case sig == syscall.SIGTERM && ws.saving.Load() && !ws.terminated.Load():
					ws.terminated.Store(true)
					ws.stop.Request(resume.StopTerminate)
					close(ws.term)
					deadline = time.After(saveTimeout)
					firstTerm = time.Now()
				case sig == syscall.SIGTERM && time.Since(firstTerm) < duplicate:
					// The same SIGTERM twice: under SLURM, scancel signals
					// every process of the step, and gorun passes it on too.
				default:
					ws.terminated.Store(ws.terminated.Load() || sig == syscall.SIGTERM)
					cancel(signalError{sig})
				}
			case <-deadline:
				cancel(signalError{syscall.SIGTERM})
			case <-ctx.Done():
				return
			}
		}
	}()
	return ws, func() {
		signal.Stop(sigs)
		cancel(nil)
		<-done
	}
}
