package status

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// ClearScreen is the escape sequences that move the cursor home and clear
// the screen: a terminal's Watch writes it before each status.
const ClearScreen = "\x1b[H\x1b[2J"

// Reader reads a run's keys once, without taking part in it: a closure
// over etcdstore.ReadStatus. It fails when etcd does not answer, or ctx
// ends.
type Reader func(ctx context.Context) (etcdstore.Status, error)

// Read reads a run's status once through read and returns its report. It
// fails as read does.
func Read(ctx context.Context, read Reader) (Report, error) {
	st, err := read(ctx)
	if err != nil {
		return Report{}, err
	}
	return New(st), nil
}

// Watch is `gorun status --watch`: the status of one run every interval.
type Watch struct {
	runID    string
	out      io.Writer
	interval time.Duration
	// terminal redraws the screen at every interval; otherwise the status
	// is printed as plain lines, under a time line, each time it changes.
	terminal bool
	last     []byte // what the previous plain print showed (see key)
}

// NewWatch watches run runID every interval, printing to out: redrawn at
// every interval when terminal says out is a terminal, else printed as
// plain lines each time it changes. It fails when interval is not above
// zero.
func NewWatch(runID string, out io.Writer, interval time.Duration, terminal bool) (*Watch, error) {
	if interval <= 0 {
		return nil, fmt.Errorf("status: --interval %v: must be above 0", interval)
	}
	return &Watch{runID: runID, out: out, interval: interval, terminal: terminal}, nil
}

// Run shows the status read by read at once and then every interval
// until ctx ends, when it returns nil. It returns an error only when
// writing to out fails; a failed read is shown and tried again.
func (w *Watch) Run(ctx context.Context, read Reader) error {
	tick := time.NewTicker(w.interval)
	defer tick.Stop()
	for {
		if err := w.show(ctx, read); err != nil {
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
func (w *Watch) show(ctx context.Context, read Reader) error {
	rep, readErr := Read(ctx, read)
	if ctx.Err() != nil {
		return nil // stopping: the read was cut short
	}
	now := time.Now()
	var page bytes.Buffer
	if readErr != nil {
		fmt.Fprintf(&page, "run %s: reading the status failed (trying again every %v): %v\n", w.runID, w.interval, readErr)
	} else {
		rep.WriteText(&page, now)
	}
	if w.terminal {
		_, err := fmt.Fprintf(w.out, "%s%s\n%s every %v; Ctrl-C to stop\n", ClearScreen, page.Bytes(), now.Format("15:04:05"), w.interval)
		return err
	}
	key := key(rep, readErr)
	if bytes.Equal(key, w.last) {
		return nil
	}
	w.last = key
	_, err := fmt.Fprintf(w.out, "--- %s\n%s", now.Format("2006-01-02 15:04:05"), page.Bytes())
	return err
}

// key is what a plain print depends on, less the clock: the report as
// --json shows it, or the read error.
func key(rep Report, readErr error) []byte {
	if readErr != nil {
		return []byte("error: " + readErr.Error())
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return []byte("error: " + err.Error())
	}
	return b
}
