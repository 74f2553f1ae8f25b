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

// Watch reads the two slot files' headers of global rank rank in dir
// whenever the rank's writer announces a complete slot (Follower), and at
// least every SafetyPoll (every interval when it cannot follow
// announcements), until ctx ends; it calls found, on Watch's goroutine,
// with each new complete snapshot: a slot whose header has become complete
// and differs from the last complete header that slot showed. The first
// read reports the newest complete slot already there. When both slots
// changed between two reads only the newer is reported, and while found
// runs nothing is read, so a consumer slower than the worker sees the
// newest snapshot only and never a queue. A stale slot with a higher step
// (left from before a restore at an older step) does not hide the new
// ones.
//
// Only the headers are read (HeaderLen bytes a slot and read): the Slot
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
	f := Follow(dir, []int{rank}, interval)
	defer f.Close()
	w := NewPoller(dir, rank)
	for ctx.Err() == nil {
		s, ok, err := w.Poll()
		if err != nil {
			return err
		}
		if ok {
			if err := found(s); err != nil {
				return err
			}
		}
		f.Wait(ctx, false)
	}
	return nil
}

// Poller finds the new complete snapshots of one rank's slots, for a
// caller that polls on its own schedule (Watch is one): it remembers the
// last complete header each slot file showed. It is not safe for
// concurrent use.
type Poller struct {
	paths [2]string
	seen  [2]*Header
}

// NewPoller returns a Poller of the slots of global rank rank in dir that
// has seen nothing yet: its first Poll reports the newest complete slot.
func NewPoller(dir string, rank int) *Poller {
	return &Poller{paths: Paths(dir, rank)}
}

// Poll reads both slots' headers (not the payloads) and returns the newest
// slot whose complete header differs from the last one that slot showed,
// and whether there is one; see Watch for what that means. A missing or
// short slot file counts as incomplete; another read error is returned,
// naming the file, and the Poll counts as not made: the next one reports
// what this one would have.
func (p *Poller) Poll() (Slot, bool, error) {
	var out Slot
	ok := false
	seen := p.seen
	for i, path := range p.paths {
		h, err := ReadHeader(path)
		switch {
		case errors.Is(err, ErrIncomplete) || errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			return Slot{}, false, err
		}
		if seen[i] != nil && *seen[i] == h {
			continue
		}
		seen[i] = &h
		if !ok || h.Step > out.Step {
			out, ok = Slot{Header: h, Path: path}, true
		}
	}
	p.seen = seen
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
