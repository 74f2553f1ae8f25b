package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// One agent of a job, the aggregator, follows every node's keys and takes
// the transitions that depend on them: it creates the first state, freezes
// a round once enough nodes joined and places each node in it, reopens the
// round when a member is lost or a node waits to join, closes the job when
// every member succeeded, and names the judge when every member stalled.
// Every other agent writes only its own keys and follows three (agentView),
// so a round costs etcd O(1) events per agent and O(N) for the aggregator,
// not O(N²).
//
// The aggregator is whoever holds the leader key, claimed under its lease.
// When it dies, its lease expires with its node key: the others see the
// leader key go, the first candidates claim it at once and the rest after
// claimFallback, and the new aggregator rebuilds everything it needs from
// etcd (the state, the roster, the nodes' keys). Two agents that both
// think they lead (one cut off, its lease not yet expired) cannot disagree:
// every transition is a compare-and-swap on the state, and a round's
// placements are written in the same transaction as its running state.

// claimCandidates is how many nodes (the lowest node ranks of the last
// round this agent was placed in, and every node not placed yet) claim the
// leader key as soon as it is gone; the others wait claimFallback first,
// so that thousands of agents do not all send the same transaction.
const (
	claimCandidates = 3
	claimFallback   = time.Second
)

// aggregateEvery is the shortest time between two looks of the aggregator
// at the job's keys.
const aggregateEvery = 5 * time.Millisecond

// campaign claims the leader key whenever it is gone and leads while this
// agent holds it, until ctx ends.
func (e *Elastic) campaign(ctx context.Context) {
	var fallback <-chan time.Time
	for ctx.Err() == nil {
		snap, changed := e.agent.read()
		switch {
		case snap.leader == e.cfg.Self.ID:
			e.leadWhileLeader(ctx)
			fallback = nil
			continue
		case !snap.led || snap.leader != "":
			fallback = nil
		case snap.placement.Round < 0 || snap.placement.Member && snap.placement.NodeRank < claimCandidates:
			e.claim(ctx)
		case fallback == nil:
			fallback = time.After(claimFallback)
		}
		select {
		case <-changed:
		case <-fallback:
			fallback = nil
			e.claim(ctx)
		case <-ctx.Done():
			return
		}
	}
}

// claim tries to take the leader key; losing to another agent is no error.
func (e *Elastic) claim(ctx context.Context) {
	won, err := e.store.Claim(ctx, KeyLeader, []byte(e.cfg.Self.ID))
	switch {
	case err != nil && ctx.Err() == nil:
		e.log.Warn().Err(err).Msg("claiming the aggregator's key")
	case won:
		e.log.Debug().Msg("this agent is the job's aggregator")
	}
}

// leadWhileLeader runs the aggregator until this agent no longer holds the
// leader key (its lease expired in an outage) or ctx ends.
func (e *Elastic) leadWhileLeader(ctx context.Context) {
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.lead(lctx)
	}()
	for ctx.Err() == nil {
		snap, changed := e.agent.read()
		if snap.leader != e.cfg.Self.ID {
			break
		}
		select {
		case <-changed:
		case <-ctx.Done():
		}
	}
	cancel()
	<-done
}

// aggregator is the state of one term of leadership.
type aggregator struct {
	e             *Elastic
	lastCallRound int       // the round whose last call started
	lastCall      time.Time // when that last call ends
	// cannotLeaveOut is the last round whose unreachable members could
	// not be left out (too few nodes would be left): said once.
	cannotLeaveOut int
}

// lead follows every key of the job and takes the transitions that fall to
// the aggregator until ctx ends. A failed step is logged and tried again
// at the next change.
func (e *Elastic) lead(ctx context.Context) {
	v := newView()
	vctx, cancel := context.WithCancel(ctx)
	viewDone := make(chan struct{})
	go func() {
		defer close(viewDone)
		v.run(vctx, e.store)
	}()
	defer func() {
		cancel()
		<-viewDone
	}()
	a := &aggregator{e: e, lastCallRound: -1, cannotLeaveOut: -1}
	for {
		// A snapshot costs O(nodes): thousands joining at once are taken
		// in batches, not one snapshot each.
		select {
		case <-time.After(aggregateEvery):
		case <-ctx.Done():
			return
		}
		snap, changed := v.read()
		_, poked := e.agent.read() // session changes and the end of an outage's grace
		wake, err := a.step(ctx, snap)
		if err != nil && ctx.Err() == nil {
			e.log.Warn().Err(err).Msg("aggregating the job's round")
			wake = time.After(100 * time.Millisecond)
		}
		select {
		case <-changed:
		case <-poked:
		case <-wake:
		case <-ctx.Done():
			return
		}
	}
}

// step takes the transition the job's keys call for, if any, and returns
// when to look again without a change (nil: at the next change).
func (a *aggregator) step(ctx context.Context, snap snapshot) (<-chan time.Time, error) {
	e, st := a.e, snap.state
	switch {
	case !snap.loaded || st.Phase == PhaseClosed:
		return nil, nil
	case snap.stateRev == 0:
		return nil, e.cas(ctx, 0, State{}, Initial(e.cfg.Limits, time.Now()))
	case st.Phase == PhaseJoinable:
		return a.joinable(ctx, snap)
	}
	if snap.roster.Round != st.Round {
		return nil, nil // a running state always comes with its roster: not in this view yet
	}
	if gone, err := a.reopenIfMembersLeft(ctx, snap); gone || err != nil {
		return nil, err
	}
	if out, err := a.leaveOutUnreachable(ctx, snap); out || err != nil {
		return nil, err
	}
	if closed, err := a.closeIfAllSucceeded(ctx, snap); closed || err != nil {
		return nil, err
	}
	if err := a.nameJudgeIfAllStalled(ctx, snap); err != nil {
		return nil, err
	}
	return nil, a.reopenIfWaiting(ctx, snap)
}

// joinable re-charges a restart to a lost node, or freezes the round when
// ShouldFreeze says so; it returns when the last call ends.
func (a *aggregator) joinable(ctx context.Context, snap snapshot) (<-chan time.Time, error) {
	e, st, lim := a.e, snap.state, a.e.cfg.Limits
	if len(snap.joined) >= lim.Needed(st.Round) && a.lastCallRound != st.Round {
		a.lastCallRound, a.lastCall = st.Round, time.Now().Add(e.cfg.LastCall)
	}
	var wake <-chan time.Time
	passed := false
	if a.lastCallRound == st.Round {
		left := time.Until(a.lastCall)
		passed = left <= 0
		if !passed {
			wake = time.After(left)
		}
	}
	// After an outage of its own, the aggregator waits out the grace
	// before it counts anyone lost or freezes without them.
	re, lost := st.Reattribute(snap.roster, snap.alive)
	if len(lost) > 0 {
		if !e.missingAreLost(ctx) {
			return wake, nil
		}
		if err := e.recordLost(ctx, st.Round-1, snap.roster.Members, lost); err != nil {
			return nil, err
		}
		return nil, e.cas(ctx, snap.stateRev, st, re)
	}
	// A node left out of this round is alive but waits until it reaches
	// every member: the round does not wait for it.
	alive := len(snap.alive)
	for _, id := range st.LeftOut {
		if snap.alive[id] && !slices.ContainsFunc(snap.joined, func(m Member) bool { return m.ID == id }) {
			alive--
		}
	}
	settled := len(snap.joined) >= lim.MaxNodes || !e.settling()
	if !settled || !ShouldFreeze(st, len(snap.joined), alive, lim, passed) {
		return wake, nil
	}
	joined := slices.Clone(snap.joined)
	sort.Slice(joined, func(i, j int) bool { return joined[i].Order < joined[j].Order })
	next, roster, err := st.Freeze(joined[:min(len(joined), lim.MaxNodes)], lim, time.Now())
	if err != nil {
		return nil, err
	}
	return nil, a.commit(ctx, snap.stateRev, st, next, roster, joined)
}

// commit writes the running state, its roster and every joined node's
// place in it together, if the state is still at rev: one transaction, so
// that a node sees the round running only with its place in it.
func (a *aggregator) commit(ctx context.Context, rev int64, from, next State, roster Roster, joined []Member) error {
	writes := make([]KV, 0, 2+PlaceBuckets)
	state, err := json.Marshal(next)
	if err != nil {
		return err
	}
	members, err := roster.Encode()
	if err != nil {
		return err
	}
	writes = append(writes, KV{Key: KeyState, Value: state}, KV{Key: KeyRoster, Value: members})
	for b, bucket := range roster.Buckets(joined) {
		data, err := bucket.Encode()
		if err != nil {
			return err
		}
		writes = append(writes, KV{Key: placeKey(b), Value: data})
	}
	won, err := a.e.store.Txn(ctx, KeyState, rev, writes...)
	if won {
		a.e.logTransition(from, next)
		a.e.log.Debug().Int("round", roster.Round).Int("members", len(roster.Members)).Int("joined", len(joined)).Msg("placed the round's nodes")
	}
	return err
}

// reopenIfMembersLeft opens the next round when a member of the running
// round has no live session and counts as lost (see
// missingAreLost). It reports whether it found one.
func (a *aggregator) reopenIfMembersLeft(ctx context.Context, snap snapshot) (bool, error) {
	e, st := a.e, snap.state
	var gone, hosts []string
	var lost []Member
	for i, m := range snap.roster.Members {
		if !snap.alive[m.ID] {
			gone = append(gone, fmt.Sprintf("%s (node %d)", m.Host, i))
			hosts = append(hosts, m.Host)
			lost = append(lost, m)
		}
	}
	if len(gone) == 0 || !e.missingAreLost(ctx) {
		return false, nil
	}
	reason := fmt.Sprintf("node %s left (its lease expired, or a peer found its agent dead)", strings.Join(gone, ", "))
	if err := e.recordLost(ctx, st.Round, snap.roster.Members, lost); err != nil {
		return true, err
	}
	next := st.Next(CauseMembership, reason, e.cfg.Limits, time.Now())
	if next.Phase == PhaseJoinable {
		next.Lost = hosts
	}
	return true, e.cas(ctx, snap.stateRev, st, next)
}

// reopenIfWaiting opens the next round when nodes wait to join and the
// running round has room for them.
func (a *aggregator) reopenIfWaiting(ctx context.Context, snap snapshot) error {
	e, st := a.e, snap.state
	if len(snap.roster.Members) >= e.cfg.Limits.MaxNodes {
		return nil
	}
	members := make(map[string]bool, len(snap.roster.Members))
	for _, m := range snap.roster.Members {
		members[m.ID] = true
	}
	var hosts []string
	for _, m := range snap.waiting {
		if !members[m.ID] && snap.alive[m.ID] {
			hosts = append(hosts, m.Host)
		}
	}
	if len(hosts) == 0 {
		return nil
	}
	sort.Strings(hosts)
	reason := fmt.Sprintf("node %s waiting to join", strings.Join(hosts, ", "))
	next := st.Next(CauseMembership, reason, e.cfg.Limits, time.Now())
	next.Grow = next.Phase == PhaseJoinable
	return e.cas(ctx, snap.stateRev, st, next)
}

// closeIfAllSucceeded closes the job as succeeded once every member's
// workers did, and reports whether it did.
func (a *aggregator) closeIfAllSucceeded(ctx context.Context, snap snapshot) (bool, error) {
	for _, m := range snap.roster.Members {
		if !snap.done[m.ID] {
			return false, nil
		}
	}
	st := snap.state
	reason := fmt.Sprintf("the workers of all %d nodes succeeded", len(snap.roster.Members))
	return true, a.e.cas(ctx, snap.stateRev, st, st.Close(ResultSucceeded, reason, time.Now()))
}

// nameJudgeIfAllStalled names the member that judges a stall once every
// member reported one with no culprit of its own: the first to report.
func (a *aggregator) nameJudgeIfAllStalled(ctx context.Context, snap snapshot) error {
	st := snap.state
	if st.Judge != "" {
		return nil
	}
	judge, first := "", int64(0)
	for _, m := range snap.roster.Members {
		rev, ok := snap.stalls[m.ID]
		if !ok {
			return nil
		}
		if judge == "" || rev < first {
			judge, first = m.ID, rev
		}
	}
	next := st
	next.Judge = judge
	return a.e.cas(ctx, snap.stateRev, st, next)
}
