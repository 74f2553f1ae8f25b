package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	revision int64 // reports so far: the order of failures, as etcd's revision is for Elastic
	failures []Failure
	kept     []Recovery
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

// record keeps failures of round r in the order they were reported; a
// worker reported again keeps its first place.
func (s *Static) record(r Round, failures []Failure) {
	for _, f := range failures {
		f.Attempt = r.Number
		i := slices.IndexFunc(s.failures, func(g Failure) bool { return g.Attempt == f.Attempt && g.Rank == f.Rank })
		if i >= 0 {
			f.Revision = s.failures[i].Revision
			s.failures[i] = f
			continue
		}
		s.revision++
		f.Revision = s.revision
		s.failures = append(s.failures, f)
	}
}

// Blame records failures of round r before the agent acts on them.
func (s *Static) Blame(_ context.Context, r Round, failures []Failure) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.record(r, failures)
	return nil
}

// Stalled is always this node's to judge: there is no other.
func (s *Static) Stalled(context.Context, Round) (bool, error) { return true, nil }

// ErrNoReform says a static rendezvous cannot re-form a running world: its
// round is fixed.
var ErrNoReform = errors.New("rendezvous: a static launch cannot re-form its world")

// Reform returns ErrNoReform: a static world has one round.
func (s *Static) Reform(context.Context, Round, string) error { return ErrNoReform }

// RunsWithout is always false: a static world has one round, with every
// node in it.
func (s *Static) RunsWithout(context.Context) bool { return false }

// Connected is always true: a static world has no store to lose.
func (s *Static) Connected() bool { return true }

// Unreachable does nothing: a static world has no other round to leave a
// node out of (the workers' own timeouts end it).
func (s *Static) Unreachable(context.Context, Round, int) error { return nil }

// Abandon records the agent's own failure f; nothing else shares the job.
func (s *Static) Abandon(_ context.Context, f Failure) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f.Agent, f.Rank, f.NodeRank = true, -1, s.Round.NodeRank
	s.record(Round{Number: s.restarts}, []Failure{f})
	return nil
}

// Failed records failures and restarts while the budget lasts.
func (s *Static) Failed(_ context.Context, r Round, failures []Failure) (End, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.record(r, failures)
	if s.restarts >= s.MaxFailures {
		return End{Closed: true, Result: ResultFailed, Reason: fmt.Sprintf("restart budget spent (%d of --max-restarts=%d used)", s.restarts, s.MaxFailures)}, nil
	}
	s.restarts++
	return End{Reason: "worker failure"}, nil
}

// FailedInPlace is Failed: a static world has one round, which cannot
// re-form around a restarted worker, so every worker restarts.
func (s *Static) FailedInPlace(ctx context.Context, r Round, failures []Failure) (End, error) {
	return s.Failed(ctx, r, failures)
}

// Succeeded ends the job: a static node does not wait for the others.
func (s *Static) Succeeded(context.Context, Round) (End, error) {
	return End{Closed: true, Result: ResultSucceeded, Reason: "the workers succeeded"}, nil
}

// Failures returns the failures recorded on this node, first first.
func (s *Static) Failures(context.Context) ([]Failure, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.failures)
	OrderFailures(out)
	return out, nil
}

// RecordRecovery keeps rec on this node (Recoveries).
func (s *Static) RecordRecovery(_ context.Context, rec Recovery) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kept = append(s.kept, rec)
	return nil
}

// Recoveries returns the in-place recoveries recorded on this node.
func (s *Static) Recoveries() []Recovery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.kept)
}
