package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"
)

// Watch polls the two slot files of global rank rank in dir every interval
// until ctx ends, and calls found, on Watch's goroutine, with each new
// complete snapshot: a slot whose header has become complete and differs
// from the last complete header that slot showed. The first poll reports
// the newest complete slot already there. When both slots changed between
// two polls only the newer is reported, and while found runs nothing is
// polled, so a consumer slower than the worker sees the newest snapshot
// only and never a queue. A stale slot with a higher step (left from before
// a restore at an older step) does not hide the new ones.
//
// Only the headers are read (HeaderLen bytes a slot and poll): the Slot
// given to found has a complete header, but its payload is not verified
// and the worker may already be overwriting it. A consumer copies the
// payload and checks the copy's CRC-32 against Slot.CRC (Verify of the
// copy, or RankSlots.Write with the CRC set), dropping a copy that
// disagrees.
//
// A missing or short slot file counts as incomplete. Watch returns nil when
// ctx ends, the error of found when found fails, and an error naming the
// file when a slot cannot be read.
func Watch(ctx context.Context, dir string, rank int, interval time.Duration, found func(Slot) error) error {
	if interval <= 0 {
		return fmt.Errorf("snapshot: watch of rank %d: poll interval %v, want > 0", rank, interval)
	}
	w := watcher{paths: Paths(dir, rank)}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if ctx.Err() != nil {
			return nil // both were ready: the end wins
		}
		s, ok, err := w.poll()
		if err != nil {
			return err
		}
		if ok {
			if err := found(s); err != nil {
				return err
			}
		}
		t.Reset(interval)
	}
}

// watcher remembers the last complete header each slot file showed.
type watcher struct {
	paths [2]string
	seen  [2]*Header
}

// poll reads both slots' headers and returns the newest slot whose complete
// header differs from the one last seen there, and whether there is one.
func (w *watcher) poll() (Slot, bool, error) {
	var out Slot
	ok := false
	for i, p := range w.paths {
		h, err := ReadHeader(p)
		switch {
		case errors.Is(err, ErrIncomplete) || errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			return Slot{}, false, err
		}
		if w.seen[i] != nil && *w.seen[i] == h {
			continue
		}
		w.seen[i] = &h
		if !ok || h.Step > out.Step {
			out, ok = Slot{Header: h, Path: p}, true
		}
	}
	return out, ok, nil
}

// ReadHeader reads and parses the header of the slot file at path, and
// nothing else: the payload is not checked (Verify checks it). The error
// wraps ErrIncomplete when the header is not complete (a short file
// included) and fs.ErrNotExist when there is no file; it names the path.
func ReadHeader(path string) (Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return Header{}, fmt.Errorf("snapshot: %w", err)
	}
	defer f.Close()
	var b [HeaderLen]byte
	if _, err := f.ReadAt(b[:], 0); err != nil {
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("%w: the file is shorter than a header", ErrIncomplete)
		}
		return Header{}, fmt.Errorf("snapshot: %s: %w", path, err)
	}
	h, err := ParseHeader(b[:])
	if err != nil {
		return Header{}, fmt.Errorf("snapshot: %s: %w", path, err)
	}
	return h, nil
}
