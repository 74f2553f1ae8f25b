package worker

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/resume"
)

// stopSignals are the signals a worker watches.
var stopSignals = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2}

// catchSignals keeps the test process alive through the stop signals it
// sends itself: while one channel is notified, a signal does not take its
// default action (SIGTERM would end the process), even one that arrives
// after the worker stopped watching.
func catchSignals(t *testing.T) {
	t.Helper()
	c := make(chan os.Signal, 16)
	signal.Notify(c, stopSignals...)
	t.Cleanup(func() { signal.Stop(c) })
}

// raise sends sig to this process.
func raise(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, syscall.Kill(os.Getpid(), sig))
}

// stoppedBy waits for ctx to end and returns its cause.
func stoppedBy(t *testing.T, ctx context.Context) error {
	t.Helper()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("the worker's context did not end")
		return nil
	}
}

// requireAlive checks that ctx has not ended within a short while (a
// signal, once sent, is delivered within it).
func requireAlive(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
		t.Fatalf("the worker's context ended: %v", context.Cause(ctx))
	case <-time.After(200 * time.Millisecond):
	}
}

func TestWatchSignals(t *testing.T) {
	catchSignals(t)
	const save, duplicate = 500 * time.Millisecond, 300 * time.Millisecond

	t.Run("SIGUSR1 and SIGUSR2 ask for a checkpoint and a requeue", func(t *testing.T) {
		for _, sig := range []syscall.Signal{syscall.SIGUSR1, syscall.SIGUSR2} {
			ws, stop := watchSignals(context.Background(), save, duplicate)
			raise(t, sig)
			require.Eventually(t, func() bool { return ws.stop.Pending() == resume.StopRequeue }, 10*time.Second, time.Millisecond)
			requireAlive(t, ws.ctx)
			require.False(t, ws.terminated.Load())
			stop()
			require.ErrorIs(t, context.Cause(ws.ctx), context.Canceled)
		}
	})

	t.Run("SIGTERM before the trainer runs stops at once", func(t *testing.T) {
		ws, stop := watchSignals(context.Background(), save, duplicate)
		defer stop()
		raise(t, syscall.SIGTERM)
		require.Equal(t, signalError{syscall.SIGTERM}, stoppedBy(t, ws.ctx))
		require.True(t, ws.terminated.Load())
		require.Zero(t, ws.stop.Pending())
	})

	t.Run("SIGTERM asks for a save, then stops after the save timeout", func(t *testing.T) {
		ws, stop := watchSignals(context.Background(), save, duplicate)
		defer stop()
		ws.saving.Store(true)
		start := time.Now()
		raise(t, syscall.SIGTERM)
		select {
		case <-ws.term:
		case <-time.After(10 * time.Second):
			t.Fatal("SIGTERM did not close term")
		}
		require.Equal(t, resume.StopTerminate, ws.stop.Pending())
		require.True(t, ws.terminated.Load())
		raise(t, syscall.SIGTERM) // the same signal again, from another sender: ignored
		require.Equal(t, signalError{syscall.SIGTERM}, stoppedBy(t, ws.ctx))
		require.GreaterOrEqual(t, time.Since(start), save, "ended by the save timeout, not by the duplicate")
	})

	t.Run("a second SIGTERM after the duplicate window stops at once", func(t *testing.T) {
		ws, stop := watchSignals(context.Background(), time.Hour, duplicate)
		defer stop()
		ws.saving.Store(true)
		raise(t, syscall.SIGTERM)
		select {
		case <-ws.term:
		case <-time.After(10 * time.Second):
			t.Fatal("SIGTERM did not close term")
		}
		time.Sleep(duplicate + 50*time.Millisecond)
		requireAlive(t, ws.ctx)
		raise(t, syscall.SIGTERM)
		require.Equal(t, signalError{syscall.SIGTERM}, stoppedBy(t, ws.ctx))
	})

	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGHUP} {
		t.Run(sig.String()+" stops at once", func(t *testing.T) {
			ws, stop := watchSignals(context.Background(), save, duplicate)
			defer stop()
			ws.saving.Store(true)
			raise(t, sig)
			require.Equal(t, signalError{sig}, stoppedBy(t, ws.ctx))
			require.False(t, ws.terminated.Load())
			require.Zero(t, ws.stop.Pending())
		})
	}

	t.Run("the parent's end ends the worker's context", func(t *testing.T) {
		parent, cancel := context.WithCancelCause(context.Background())
		ws, stop := watchSignals(parent, save, duplicate)
		defer stop()
		cause := errors.New("caller gave up")
		cancel(cause)
		require.Equal(t, cause, stoppedBy(t, ws.ctx))
	})
}
