package broadcast

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// closed says whether ch is closed, without waiting.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestSignal is the contract, one sequence of calls per case.
func TestSignal(t *testing.T) {
	tests := []struct {
		name string
		run  func(s *Signal) (old, now <-chan struct{})
		// oldClosed and nowClosed: whether the channel taken first, and the one Changed
		// returns at the end, are closed.
		oldClosed, nowClosed bool
	}{
		{name: "no notify", run: func(s *Signal) (_, _ <-chan struct{}) { c := s.Changed(); return c, s.Changed() }},
		{name: "notify closes the channel taken before", run: func(s *Signal) (_, _ <-chan struct{}) { c := s.Changed(); s.Notify(); return c, s.Changed() }, oldClosed: true},
		{name: "two notifies", run: func(s *Signal) (_, _ <-chan struct{}) {
			c := s.Changed()
			s.Notify()
			s.Notify()
			return c, s.Changed()
		}, oldClosed: true},
		{name: "notify before the first Changed", run: func(s *Signal) (_, _ <-chan struct{}) { s.Notify(); c := s.Changed(); return c, s.Changed() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s Signal
			old, now := tt.run(&s)
			require.Equal(t, tt.oldClosed, closed(old), "the channel taken first")
			require.Equal(t, tt.nowClosed, closed(now), "the channel Changed returns now")
		})
	}
}

// TestSignalWakesEveryWaiter: every waiter that took the channel before a Notify wakes, with
// Notify and Changed called concurrently (run under -race).
func TestSignalWakesEveryWaiter(t *testing.T) {
	var s Signal
	const waiters = 16
	var took, woke sync.WaitGroup
	took.Add(waiters)
	woke.Add(waiters)
	for range waiters {
		go func() {
			defer woke.Done()
			ch := s.Changed()
			took.Done()
			<-ch
		}()
	}
	took.Wait()
	var notifiers sync.WaitGroup
	for range 4 {
		notifiers.Go(func() { s.Notify(); _ = s.Changed() })
	}
	notifiers.Wait()
	woke.Wait()
}
