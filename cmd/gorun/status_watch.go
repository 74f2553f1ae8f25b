package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gorun/gorun/rendezvous/status"
)

// newStatusWatch is --watch: run runID's status every interval, printed
// to out, redrawn when out is a terminal.
func newStatusWatch(runID string, out io.Writer, interval time.Duration) (*status.Watch, error) {
	f, isFile := out.(*os.File)
	return status.NewWatch(runID, out, interval, isFile && isTerminal(f))
}

// runStatusWatch runs w over read until ctx ends or SIGINT or SIGTERM
// arrives, which is a clean stop (nil).
func runStatusWatch(ctx context.Context, w *status.Watch, read status.Reader) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return w.Run(ctx, read)
}
