package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// EvictedError is Next's error once this node evicted itself (Evict): the
// job goes on without it.
type EvictedError struct{ Reason string }

func (e *EvictedError) Error() string {
	return "rendezvous: this node was evicted from the job: " + e.Reason
}

// ErrEvictTooFew is Evict's error when the round could not go on without
// this node: fewer than the job's minimum of nodes would be left.
var ErrEvictTooFew = errors.New("rendezvous: evicting this node would leave fewer nodes than the job's minimum")

// evictState is set once this node evicted itself.
type evictState struct {
	mu     sync.Mutex
	reason string
}

// Evict takes this node out of the job for good (why says why: a rank that
// stays the job's straggler): it records the eviction as this node's
// failure, for every node's report and gorun status, and opens the next
// round without it, as for a lost node, so the others re-form in place
// and a spare waiting to join is taken in. Next then returns an
// *EvictedError. It does nothing when this node is not a member of the
// running round (the round is changing: try again later), and fails with
// ErrEvictTooFew when fewer than the job's minimum of nodes would be
// left, or when the store does.
func (e *Elastic) Evict(ctx context.Context, why string) error {
	snap, _ := e.agent.read()
	st, p := snap.state, snap.placement
	if st.Phase != PhaseRunning || p.Round != st.Round || !p.Member {
		return nil
	}
	if st.Nodes-1 < e.cfg.Limits.MinNodes {
		return ErrEvictTooFew
	}
	self := e.cfg.Self
	reason := fmt.Sprintf("node %s evicted: %s", self.Host, why)
	f := Failure{Host: self.Host, NodeRank: p.NodeRank, Rank: -1, Signal: "evicted", Time: time.Now(), Attempt: st.Round, Error: reason}
	if err := e.put(ctx, nodeFailureKey(st.Round, self.ID), f, false); err != nil {
		return err
	}
	next := st.Next(CauseMembership, reason, e.cfg.Limits, time.Now())
	if next.Phase == PhaseJoinable {
		next.Lost, next.LeftOut = []string{self.Host}, []string{self.ID}
	}
	data, err := json.Marshal(next)
	if err != nil {
		return err
	}
	won, err := e.store.Txn(ctx, KeyState, snap.stateRev, KV{Key: KeyState, Value: data})
	if err != nil || !won {
		return err // lost the race to another change: the caller tries again
	}
	e.logTransition(st, next)
	e.evict.set(reason)
	return nil
}

// set records that this node evicted itself, for reason.
func (s *evictState) set(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reason = reason
}

// err is Next's error after Evict, else nil.
func (s *evictState) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reason == "" {
		return nil
	}
	return &EvictedError{Reason: s.reason}
}
