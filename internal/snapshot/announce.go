package snapshot

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Announce tells whoever follows the slot file at path (Follower)
// that its header has just become complete: it sets the file's access and
// modification times to now, which raises inotify's IN_ATTRIB on it. A
// writer calls it after writing the header; the Python package does the
// same with os.utime (docs/snapshots-format.md, "A save", step 5). Writes
// raise no IN_ATTRIB (nor does anything written through a mapping raise an
// event at all), so the announcement is the only event a follower wakes
// for. The error names the path.
func Announce(path string) error {
	now := time.Now()
	if err := os.Chtimes(path, now, now); err != nil {
		return fmt.Errorf("snapshot: announce: %w", err)
	}
	return nil
}

// announcements is a follower of some ranks' slot files in a directory:
// C receives a value each time one of those files is announced complete
// (Announce) and when the kernel dropped events (its queue overflowed),
// so that a receiver polls the headers (Poller) only then instead of on a
// clock. Values do not queue: C holds at most one, so announcements made
// while nobody received collapse into one. It is safe for concurrent use.
type announcements struct {
	// C receives a value after one or more announcements.
	C <-chan struct{}

	f    *os.File
	done chan struct{}
	once sync.Once
}

// listenAnnouncements starts following the slot files (Paths) of ranks in
// dir, which must exist. It returns an error, following nothing, when the
// kernel gives no inotify instance (the per-user limit,
// fs.inotify.max_user_instances, is reached) or dir cannot be watched:
// the caller then polls on a clock. Close stops it.
func listenAnnouncements(dir string, ranks []int) (*announcements, error) {
	names := map[string]bool{}
	for _, r := range ranks {
		for _, p := range Paths(dir, r) {
			names[filepath.Base(p)] = true
		}
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("snapshot: no inotify instance to follow %s (raise fs.inotify.max_user_instances): %w", dir, err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_ATTRIB|unix.IN_ONLYDIR); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("snapshot: cannot follow %s: %w", dir, err)
	}
	// Non-blocking, so that os.File reads through the runtime's poller and
	// Close ends a Read in progress.
	f := os.NewFile(uintptr(fd), "inotify:"+dir)
	c := make(chan struct{}, 1)
	a := &announcements{C: c, f: f, done: make(chan struct{})}
	go a.read(c, names)
	return a, nil
}

// read delivers the events of a's inotify instance on c until a is closed.
func (a *announcements) read(c chan<- struct{}, names map[string]bool) {
	defer close(a.done)
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := a.f.Read(buf)
		if err != nil {
			return // closed; no other error is expected of an inotify read
		}
		if announced(buf[:n], names) {
			select {
			case c <- struct{}{}:
			default:
			}
		}
	}
}

// announced reports whether the inotify events in b name one of names, or
// say that events were lost.
func announced(b []byte, names map[string]bool) bool {
	for len(b) >= unix.SizeofInotifyEvent {
		// struct inotify_event: wd, mask, cookie, len, then len bytes of name.
		mask := binary.NativeEndian.Uint32(b[4:8])
		end := unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(b[12:16]))
		if end > len(b) {
			return true // cannot happen: the kernel returns whole events
		}
		if mask&unix.IN_Q_OVERFLOW != 0 {
			return true
		}
		if names[cString(b[unix.SizeofInotifyEvent:end])] {
			return true
		}
		b = b[end:]
	}
	return false
}

// cString is the NUL-padded name of an inotify event as a string.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// Close stops following and waits until nothing more is delivered. A
// second Close does nothing.
func (a *announcements) Close() error {
	var err error
	a.once.Do(func() {
		err = a.f.Close()
		<-a.done
	})
	return err
}

// SafetyPoll is how often a Follower has the headers read when its
// writers announce their slots: only a writer that does not announce
// waits for it.
const SafetyPoll = time.Second

// Follower says when to read some ranks' slot headers again: as soon as
// their writer announces a complete slot (announcements), and on a clock
// besides, every SafetyPoll, or every poll when the kernel gave no
// inotify instance (Err says why). It is not safe for concurrent use.
type Follower struct {
	a    *announcements
	err  error
	poll time.Duration
}

// Follow returns a Follower of the slot files of ranks in dir that polls
// every poll when it cannot follow announcements. Close releases it.
func Follow(dir string, ranks []int, poll time.Duration) *Follower {
	a, err := listenAnnouncements(dir, ranks)
	return &Follower{a: a, err: err, poll: poll}
}

// Err is why the Follower cannot follow announcements and polls every
// poll instead; nil when it follows them.
func (f *Follower) Err() error { return f.err }

// Wait blocks until the headers are to be read again: an announcement
// came (or came while nobody waited), or the clock ran out: SafetyPoll,
// or poll when soon (the caller has something to retry) or when there are
// no announcements. It returns false, at once, when ctx has ended.
func (f *Follower) Wait(ctx context.Context, soon bool) bool {
	d := f.poll
	var announced <-chan struct{}
	if f.a != nil {
		announced = f.a.C
		if !soon {
			d = SafetyPoll
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-announced:
	case <-t.C:
	}
	return ctx.Err() == nil
}

// Close stops following announcements.
func (f *Follower) Close() error {
	if f.a == nil {
		return nil
	}
	return f.a.Close()
}
