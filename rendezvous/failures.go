package rendezvous

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// MaxListedFailures is how many failure reports an agent reads when the
// job failed, to print the first: the first in key order (see failureKey).
const MaxListedFailures = 64

// OrderFailures sorts failures first first, by cause and not by any
// host's clock: round by round, and within a round, nodes lost and agents
// failed come first (a node's death breaks its peers' workers before its
// lease shows it), then workers that failed on their own, then workers
// that failed because a peer was lost (LostPeer names a rank whose own
// failure is reported in the same round); ties go by the etcd revision of
// the first report, the order in which the job learnt of them.
func OrderFailures(failures []Failure) {
	covered := map[[2]int]bool{} // (round, rank) with a report of their own
	for _, f := range failures {
		covered[[2]int{f.Attempt, f.Rank}] = true
		for _, r := range f.Ranks {
			covered[[2]int{f.Attempt, r}] = true
		}
	}
	tier := func(f Failure) int {
		switch {
		case f.Agent || f.Rank < 0:
			return 0
		case f.LostPeer != nil && *f.LostPeer != f.Rank && covered[[2]int{f.Attempt, *f.LostPeer}]:
			return 2
		}
		return 1
	}
	slices.SortStableFunc(failures, func(a, b Failure) int {
		return cmp.Or(cmp.Compare(a.Attempt, b.Attempt), cmp.Compare(tier(a), tier(b)), cmp.Compare(a.Revision, b.Revision))
	})
}

// Blame records failures of running round r now, before the agent acts on
// them (kills a hung worker, say): whatever that action breaks is reported
// later and so ordered after them. It does not end r; the agent reports
// the round's failures with Failed once its workers are reaped.
func (e *Elastic) Blame(ctx context.Context, r Round, failures []Failure) error {
	for _, f := range failures {
		f.Error = CutError(f.Error, MaxErrorBytes, "")
		if err := e.put(ctx, failureKey(r.Number, f), f, false); err != nil {
			return err
		}
	}
	return nil
}

// Stalled says that this node's workers stopped making progress in round
// r and none of them is to blame here (none is stopped or stuck in the
// kernel). It blocks until the round ends elsewhere (false: another node
// found the culprit) or every member of r has said the same and the
// aggregator named the judge (true for exactly one of them, the first to
// say it: that node names its own culprit). It fails when the store does
// or ctx ends.
func (e *Elastic) Stalled(ctx context.Context, r Round) (bool, error) {
	if err := e.put(ctx, stallKey(r.Number, e.cfg.Self.ID), e.cfg.Self.Host, true); err != nil {
		return false, err
	}
	for {
		snap, changed := e.agent.read()
		st := snap.state
		if _, over := roundOver(st, r); over {
			return false, nil
		}
		if st.Judge != "" {
			return st.Judge == e.cfg.Self.ID, nil
		}
		if err := e.await(ctx, changed); err != nil {
			return false, err
		}
	}
}

// Abandon records f, this node's agent's own failure (Error says why it
// cannot go on), in the job's current round, and closes the job as
// failed, so that every other agent ends its round at once and reports
// it. It returns when the job is closed, or with the error that kept it
// from recording that.
func (e *Elastic) Abandon(ctx context.Context, f Failure) error {
	snap, _ := e.agent.read()
	f.Host, f.Agent, f.Rank, f.NodeRank, f.Attempt = e.cfg.Self.Host, true, -1, -1, snap.state.Round
	f.Error = CutError(f.Error, MaxErrorBytes, "")
	if p := snap.placement; p.Round == snap.state.Round && p.Member {
		f.NodeRank = p.NodeRank
	}
	if err := e.put(ctx, agentFailureKey(f.Attempt, e.cfg.Self.ID), f, false); err != nil {
		return err
	}
	for {
		snap, changed := e.agent.read()
		st := snap.state
		if st.Phase == PhaseClosed {
			return nil
		}
		if err := e.cas(ctx, snap.stateRev, st, st.Close(ResultFailed, f.String(), time.Now())); err != nil {
			return err
		}
		if err := e.await(ctx, changed); err != nil {
			return err
		}
	}
}
