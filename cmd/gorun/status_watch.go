package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// Escape sequences that move the cursor home and clear the screen.
const clearScreen = "\x1b[H\x1b[2J"

// statusWatch is `gorun status --watch`: the job's status every interval
// until ctx ends or SIGINT or SIGTERM arrives, which is a clean stop.
type statusWatch struct {
	runID    string
	out      io.Writer
	interval time.Duration
	// terminal redraws the screen at every interval; otherwise the status
	// is printed as plain lines, under a time line, each time it changes.
	terminal bool
	last     []byte // what the previous plain print showed (see key)
}

// newStatusWatch watches runID every interval, printing to out: a
// terminal when out is one.
func newStatusWatch(runID string, out io.Writer, interval time.Duration) (*statusWatch, error) {
	if interval <= 0 {
		return nil, fmt.Errorf("status: --interval %v: must be above 0", interval)
	}
	f, isFile := out.(*os.File)
	return &statusWatch{runID: runID, out: out, interval: interval, terminal: isFile && isTerminal(f)}, nil
}

// Run shows the status read through client at once and then every
// interval. It returns nil when ctx ends or on SIGINT or SIGTERM, and an
// error only when writing to out fails; a failed read of etcd is shown
// and tried again.
func (w *statusWatch) Run(ctx context.Context, client *clientv3.Client) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	tick := time.NewTicker(w.interval)
	defer tick.Stop()
	for {
		if err := w.show(ctx, client); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// show reads the status once and prints it as the mode says.
func (w *statusWatch) show(ctx context.Context, client *clientv3.Client) error {
	st, readErr := etcdstore.ReadStatus(ctx, client, w.runID)
	if ctx.Err() != nil {
		return nil // stopping: the read was cut short
	}
	now := time.Now()
	var page bytes.Buffer
	if readErr != nil {
		fmt.Fprintf(&page, "run %s: reading the status failed (trying again every %v): %v\n", w.runID, w.interval, readErr)
	} else {
		writeStatus(&page, st, now)
	}
	if w.terminal {
		_, err := fmt.Fprintf(w.out, "%s%s\n%s every %v; Ctrl-C to stop\n", clearScreen, page.Bytes(), now.Format("15:04:05"), w.interval)
		return err
	}
	key := statusKey(st, readErr)
	if bytes.Equal(key, w.last) {
		return nil
	}
	w.last = key
	_, err := fmt.Fprintf(w.out, "--- %s\n%s", now.Format("2006-01-02 15:04:05"), page.Bytes())
	return err
}

// statusKey is what a plain print depends on, less the clock: the report
// as --json shows it, or the read error.
func statusKey(st etcdstore.Status, readErr error) []byte {
	if readErr != nil {
		return []byte("error: " + readErr.Error())
	}
	b, err := json.Marshal(newStatusReport(st))
	if err != nil {
		return []byte("error: " + err.Error())
	}
	return b
}
