package rendezvous

import (
	"context"
	"fmt"
	"sync"
)

// Static is torchrun's static rendezvous: every node knows the whole job
// up front (node count, its own rank, the master), nothing is shared
// between nodes, and restarts after a worker failure are this node's own,
// within MaxFailures. Safe for use from one goroutine plus Watch.
type Static struct {
	Round       Round // the fixed round; Number is counted here
	MaxFailures int

	mu       sync.Mutex
	restarts int
	failures []Failure
}

// Next returns the fixed round at once, numbered by the restarts so far.
func (s *Static) Next(ctx context.Context) (Round, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.Round
	r.Number = s.restarts
	return r, ctx.Err()
}

// Watch never ends a static round: nothing outside this node can. The
// channel closes when ctx ends.
func (s *Static) Watch(ctx context.Context, _ Round) <-chan End {
	out := make(chan End)
	go func() {
		<-ctx.Done()
		close(out)
	}()
	return out
}

// Failed records failures and restarts while the budget lasts.
func (s *Static) Failed(_ context.Context, _ Round, failures []Failure) (End, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = append(s.failures, failures...)
	if s.restarts >= s.MaxFailures {
		return End{Closed: true, Result: ResultFailed, Reason: fmt.Sprintf("restart budget spent (%d of --max-restarts=%d used)", s.restarts, s.MaxFailures)}, nil
	}
	s.restarts++
	return End{Reason: "worker failure"}, nil
}

// Succeeded ends the job: a static node does not wait for the others.
func (s *Static) Succeeded(context.Context, Round) (End, error) {
	return End{Closed: true, Result: ResultSucceeded, Reason: "the workers succeeded"}, nil
}

// Failures returns the failures recorded on this node, first first.
func (s *Static) Failures(context.Context) ([]Failure, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Failure(nil), s.failures...), nil
}
