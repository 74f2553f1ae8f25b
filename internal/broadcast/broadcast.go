package broadcast

import "sync"

// Signal is a wake-up for any number of waiters. A waiter takes Changed's channel, reads the
// state it depends on, and waits for the channel to close: a Notify after Changed closes it,
// so no change between the read and the wait is missed. The zero value is ready; a Signal
// must not be copied after first use. Its methods are safe for concurrent use, and may be
// called with the lock of the state the Signal stands for held (it takes only its own).
type Signal struct {
	mu sync.Mutex
	ch chan struct{}
}

// Changed returns the channel that closes at the next Notify.
func (s *Signal) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

// Notify closes the channel Changed returned, waking every waiter, and starts the next one.
func (s *Signal) Notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
	}
	s.ch = make(chan struct{})
}
