package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/rendezvous/liveness"
)

// ErrEtcdUnreachable means etcd did not answer for JoinTimeout while this
// agent needed it: to form a round, or to report how its workers ended.
// An outage alone never ends a running round: workers keep running.
var ErrEtcdUnreachable = errors.New("rendezvous: etcd unreachable")

// ClosedError says the job is over: it was closed by some node.
type ClosedError struct {
	Result string // ResultSucceeded or ResultFailed
	Reason string
}

func (e *ClosedError) Error() string {
	return fmt.Sprintf("rendezvous: the job is closed (%s): %s", e.Result, e.Reason)
}

// End is how a running round ended for this node.
type End struct {
	Closed bool   // the job is over (Result says how); else a new round is open
	Result string // when Closed
	Reason string // why the round ended
	// Cause is why the next round opened, when it is open: CauseMembership
	// (a node was lost or is waiting to join), which leaves every worker
	// elsewhere intact, or CauseFailure (a worker failed somewhere).
	Cause Cause
	// Lost names the nodes whose loss opened the next round, when they
	// are known (CauseMembership).
	Lost []string
	// InPlace says the next round opened for a worker failure whose agent
	// restarts that worker alone (CauseFailure): the other workers go on
	// in place.
	InPlace bool
	// Grow says the next round opened only for nodes waiting to join: the
	// running workers' world is intact (State.Grow).
	Grow bool
}

// Config is one agent's part in an elastic job.
type Config struct {
	Self        Member // ID, Host, Addr, Preferred, NProc; Order is set on joining
	Limits      Limits
	LastCall    time.Duration // after MinNodes joined, how long to wait for more
	JoinTimeout time.Duration // how long a round may take to form before Next gives up
	// LeaseTTL is the session lease's TTL: a worker failure that would
	// close the job waits this long (and a second) for a node loss that
	// explains it, and after an etcd outage of its own this agent gives
	// nodes whose keys vanished this long to put them again before it
	// counts them lost. 0: no wait.
	LeaseTTL time.Duration
	// FreePort picks the MASTER_PORT this node offers on its address
	// when it joins a round, should it be node rank 0 of that round.
	FreePort func(addr string) (int, error)
	Log      zerolog.Logger
}

// Validate reports what makes cfg unusable.
func (c Config) Validate() error {
	switch {
	case c.Self.ID == "" || strings.ContainsAny(c.Self.ID, "/ "):
		return fmt.Errorf("rendezvous: node id %q must be non-empty without '/' or spaces", c.Self.ID)
	case c.Self.Addr == "":
		return errors.New("rendezvous: node address is empty")
	case c.Self.NProc < 1:
		return fmt.Errorf("rendezvous: %d workers on this node", c.Self.NProc)
	case c.Limits.MinNodes < 1 || c.Limits.MinNodes > c.Limits.MaxNodes:
		return fmt.Errorf("rendezvous: nodes %d:%d: want 1 <= MIN <= MAX", c.Limits.MinNodes, c.Limits.MaxNodes)
	case c.Limits.StartNodes < 0 || c.Limits.StartNodes > c.Limits.MaxNodes:
		return fmt.Errorf("rendezvous: %d nodes to start with, %d at most: want 0..MAX", c.Limits.StartNodes, c.Limits.MaxNodes)
	case c.Limits.MaxFailures < 0 || c.Limits.MaxChanges < 0:
		return errors.New("rendezvous: negative restart budget")
	case c.LastCall < 0 || c.JoinTimeout <= 0:
		return fmt.Errorf("rendezvous: last call %s, join timeout %s", c.LastCall, c.JoinTimeout)
	case c.FreePort == nil:
		return errors.New("rendezvous: no FreePort")
	}
	return nil
}

// Elastic is one agent's handle on an elastic job over a Store. Its methods
// are called from the agent's one goroutine, except Watch's channel. In
// the background it follows its own keys (agentView) and, while it holds
// the leader key, aggregates the job (see campaign).
type Elastic struct {
	cfg    Config
	store  Store
	agent  *agentView
	log    zerolog.Logger
	cancel context.CancelFunc
	wg     sync.WaitGroup
	last   int              // the last round Next returned; -1 before the first
	prober *liveness.Prober // checks the peers this node's workers stopped hearing from
	gate   *liveness.Gate   // keeps this node out while it was left out and cannot reach every member
	evict  evictState
	// exchanged is the round of this node's last Exchange, whose key the
	// next one deletes; -1 before the first.
	exchanged int
}

// Join registers this node with the job (a leased key: its liveness) and
// starts following the job's keys and its session. The returned Elastic
// owns store and closes it in Close.
func Join(ctx context.Context, store Store, cfg Config) (*Elastic, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Self.Since.IsZero() {
		cfg.Self.Since = time.Now()
	}
	self, _ := json.Marshal(cfg.Self)
	if err := store.Put(ctx, nodeKey(cfg.Self.ID), self, true); err != nil {
		return nil, err
	}
	vctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e := &Elastic{cfg: cfg, store: store, agent: newAgentView(cfg.Self.ID), cancel: cancel, last: -1, exchanged: -1,
		log: cfg.Log.With().Str("component", "rendezvous").Logger()}
	e.prober = liveness.NewProber(fencer{e}, e.log)
	e.gate = liveness.NewGate(cfg.Self.ID, peers(store, cfg.Self.ID), e.log)
	for _, run := range []func(context.Context){
		func(ctx context.Context) { e.agent.run(ctx, store) },
		e.followSession,
		e.campaign,
	} {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			run(vctx)
		}()
	}
	return e, nil
}

// Close stops following the job and releases the lease, which deletes
// this node's keys at once.
func (e *Elastic) Close() error {
	e.cancel()
	e.wg.Wait()
	return e.store.Close()
}

func (e *Elastic) put(ctx context.Context, key string, v any, leased bool) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return e.store.Put(ctx, key, data, leased)
}

// cas replaces the state at rev with next; losing the race is no error.
func (e *Elastic) cas(ctx context.Context, rev int64, from, next State) error {
	data, err := json.Marshal(next)
	if err != nil {
		return err
	}
	if next.Phase == PhaseClosed {
		// The close is seen by every agent's watch as soon as etcd commits
		// it, before this call hears back: the agents leave, and this one's
		// Close cancels ctx. Cut short there, the call would report a lost
		// race for a close that happened, and skip the retention.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), retainTimeout)
		defer cancel()
	}
	won, err := e.store.Txn(ctx, KeyState, rev, KV{Key: KeyState, Value: data})
	if won {
		e.logTransition(from, next)
	}
	if won && next.Phase == PhaseClosed {
		e.retain(ctx)
	}
	return err
}

// retainTimeout bounds the retention of a closed job's keys by the agent
// that closed it.
const retainTimeout = 5 * time.Second

// retain attaches the closed job's keys to their retention lease (the job
// is over: they go after the store's retention TTL). It runs under its own
// bound, not under ctx: every agent sees the job closed as soon as the
// state says so and leaves, and the closing agent's own Close cancels the
// aggregator's context; cut short, the retention never happened ("context
// canceled" in most runs). Close waits for it.
func (e *Elastic) retain(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), retainTimeout)
	defer cancel()
	if err := e.store.Retain(rctx); err != nil {
		e.log.Warn().Err(err).Msg("the closed job's keys stay until its run id starts again")
	}
}

func (e *Elastic) logTransition(from, next State) {
	e.log.Info().Int("round", next.Round).Str("from", string(from.Phase)).Str("to", string(next.Phase)).Str("reason", next.Reason).Msg("round state")
}

// Next joins the job's next round (one after any round it returned
// before) and blocks until it runs, then returns this node's place in it.
// It fails when the job is closed (*ClosedError), when the round does not
// form within JoinTimeout (ErrEtcdUnreachable when etcd was away all
// that time), or when ctx ends. A node that waits while the job runs
// without it (a spare, a node left out) waits as long as it runs.
func (e *Elastic) Next(ctx context.Context) (Round, error) {
	timeout := time.NewTimer(e.cfg.JoinTimeout)
	defer timeout.Stop()
	joinedRound, waiting := -1, false
	selfChecked := -1          // the round for which this node read its own key
	var retry <-chan time.Time // a node left out probes the members again
	for {
		if err := e.evict.err(); err != nil {
			return Round{}, err
		}
		snap, changed := e.agent.read()
		st, p := snap.state, snap.placement
		placed := p.Round == st.Round
		if selfChecked != st.Round && st.Round > e.last && (placed && !p.Member || slices.Contains(st.Lost, e.cfg.Self.Host)) {
			// The round left this node out, or opened for its loss: a peer
			// may have fenced it (Unreachable). One read of its own key says.
			checked, err := e.registerIfFenced(ctx)
			if err != nil {
				return Round{}, err
			}
			if checked {
				selfChecked = st.Round
			}
		}
		switch {
		case snap.stateRev == 0:
			// The aggregator writes the job's first state.
		case st.Phase == PhaseClosed:
			return Round{}, &ClosedError{Result: st.Result, Reason: st.Reason}
		case st.Round <= e.last:
			// This node's view has not yet caught up with the round that
			// replaced the one it ran: wait for it.
		case st.Phase == PhaseJoinable:
			e.gate.LeftOut(st.Round, st.LeftOut, st.Reason)
			if joinedRound != st.Round && !e.gate.Open(ctx) {
				retry = time.After(liveness.RejoinEvery)
				break
			}
			if joinedRound != st.Round {
				self := e.cfg.Self
				port, err := e.cfg.FreePort(self.Addr)
				if err != nil {
					return Round{}, fmt.Errorf("rendezvous: pick a MASTER_PORT to offer on %s: %w", self.Addr, err)
				}
				self.Port = port
				if err := e.put(ctx, joinKey(st.Round, self.ID), self, true); err != nil {
					return Round{}, err
				}
				if waiting {
					_ = e.store.Delete(ctx, waitKey(e.cfg.Self.ID))
					waiting = false
				}
				joinedRound = st.Round
				e.log.Debug().Int("round", st.Round).Msg("joined round")
			}
		case placed && p.Member && st.Phase == PhaseRunning:
			r, _ := st.RoundFor(p)
			e.last = r.Number
			return r, nil
		case (placed || joinedRound != st.Round) && !waiting:
			// The round formed without this node: it came late, or the
			// round was full, or it was left out and reaches every member
			// again. The aggregator opens the next one for it when there
			// is room.
			e.gate.LeftOut(st.Round, st.LeftOut, st.Reason)
			if !e.gate.Open(ctx) {
				retry = time.After(liveness.RejoinEvery)
				break
			}
			if err := e.put(ctx, waitKey(e.cfg.Self.ID), e.cfg.Self, true); err != nil {
				return Round{}, err
			}
			waiting = true
			e.log.Info().Int("round", st.Round).Int("members", st.Nodes).Msg("round already formed: waiting for the next one")
		}
		select {
		case <-changed:
		case <-retry:
			retry = nil
		case <-timeout.C:
			if sess, _ := e.store.Session(); sess.Live && st.Phase == PhaseRunning && (waiting || e.gate.Err() != nil) {
				// A spare, or a node left out for a network fault, waits
				// as long as the job runs without it: the aggregator takes
				// it in when there is room (once it reaches every member),
				// and the job's end ends the wait. Giving up would close
				// the job for everyone.
				timeout.Reset(e.cfg.JoinTimeout)
				continue
			}
			return Round{}, e.formError(ctx, st)
		case <-ctx.Done():
			return Round{}, context.Cause(ctx)
		}
	}
}

func (e *Elastic) formError(ctx context.Context, st State) error {
	if sess, _ := e.store.Session(); !sess.Live {
		return fmt.Errorf("%w: no answer for %s, and no round took this node within join_timeout=%s",
			ErrEtcdUnreachable, time.Since(sess.Since).Round(time.Second), e.cfg.JoinTimeout)
	}
	if err := e.gate.Err(); err != nil {
		return fmt.Errorf("rendezvous: this node was left out of the job for a network fault and could not reach every member within join_timeout=%s: %w",
			e.cfg.JoinTimeout, err)
	}
	lim := e.cfg.Limits
	if st.Phase == PhaseJoinable {
		// Only now, on the way out, does this agent read the other
		// nodes' keys: to say who came.
		joined, _, err := e.store.List(ctx, joinPrefix(st.Round), 0)
		if err == nil && len(joined) < lim.Needed(st.Round) {
			var hosts []string
			for _, kv := range joined {
				var m Member
				if json.Unmarshal(kv.Value, &m) == nil {
					hosts = append(hosts, m.Host)
				}
			}
			sort.Strings(hosts)
			return fmt.Errorf("rendezvous: round %d did not form within join_timeout=%s: %d of at least %d nodes joined (%s)",
				st.Round, e.cfg.JoinTimeout, len(hosts), lim.Needed(st.Round), strings.Join(hosts, ", "))
		}
	}
	return fmt.Errorf("rendezvous: no round took this node within join_timeout=%s (round %d is %s with %d of at most %d nodes)",
		e.cfg.JoinTimeout, st.Round, st.Phase, st.Nodes, lim.MaxNodes)
}

// Watch follows running round r and sends one End when it is over for a
// reason that is not this node's own: another node failed, left or is
// waiting to join (a new round opened), or the job closed. An etcd outage
// does not end it: the round goes on once the session is re-established
// and its members re-registered. The channel closes after the End, or
// when ctx ends.
func (e *Elastic) Watch(ctx context.Context, r Round) <-chan End {
	out := make(chan End, 1)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer close(out)
		for {
			snap, changed := e.agent.read()
			if end, over := roundOver(snap.state, r); over {
				out <- end
				return
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// roundOver reports whether the job moved past round r.
func roundOver(st State, r Round) (End, bool) {
	switch {
	case st.Phase == PhaseClosed:
		return End{Closed: true, Result: st.Result, Reason: st.Reason}, true
	case st.Round != r.Number:
		return End{Reason: st.Reason, Cause: st.Cause, Lost: st.Lost, InPlace: st.InPlace, Grow: st.Grow}, true
	}
	return End{}, false
}

// Failed reports this node's worker failures in round r (kept in etcd for
// every node's final report) and opens the next round, charged to the
// worker-failure budget, or closes the job as failed when the budget is
// spent. It returns how round r ended; when another node already moved
// the job on, that is what it returns.
func (e *Elastic) Failed(ctx context.Context, r Round, failures []Failure) (End, error) {
	return e.failed(ctx, r, failures, false)
}

// FailedInPlace is Failed for failures this node's agent recovers from
// alone: it restarts the failed workers by themselves, and every other
// worker of the job goes on into the next round in place (State.InPlace).
// The restart is charged to the worker-failure budget all the same, so a
// worker that keeps failing ends the job when the budget is spent.
func (e *Elastic) FailedInPlace(ctx context.Context, r Round, failures []Failure) (End, error) {
	return e.failed(ctx, r, failures, true)
}

func (e *Elastic) failed(ctx context.Context, r Round, failures []Failure, inPlace bool) (End, error) {
	if err := e.Blame(ctx, r, failures); err != nil {
		return End{}, err
	}
	reason := "worker failure"
	if len(failures) > 0 {
		reason = "worker failure: " + failures[0].String()
	}
	if inPlace {
		reason += "; restarted alone, the other workers go on in place"
	}
	// A node that dies makes its peers' workers fail before its lease
	// expires. When this failure would spend the last of the budget and
	// close the job, first give the leases time to show such a loss.
	waited := e.cfg.LeaseTTL <= 0
	var lossDeadline <-chan time.Time
	for {
		snap, changed := e.agent.read()
		st := snap.state
		if end, over := roundOver(st, r); over {
			return end, nil
		}
		next := st.Next(CauseFailure, reason, e.cfg.Limits, time.Now())
		next.InPlace = inPlace && next.Phase == PhaseJoinable
		if next.Phase == PhaseClosed && !waited {
			if lossDeadline == nil {
				e.log.Info().Dur("wait", e.cfg.LeaseTTL+time.Second).Msg("restart budget spent: waiting out the lease TTL for a lost node that would explain the failure")
				lossDeadline = time.After(e.cfg.LeaseTTL + time.Second)
			}
			select {
			case <-changed:
			case <-lossDeadline:
				waited = true
			case <-ctx.Done():
				return End{}, context.Cause(ctx)
			}
			continue
		}
		if err := e.cas(ctx, snap.stateRev, st, next); err != nil {
			return End{}, err
		}
		if err := e.await(ctx, changed); err != nil {
			return End{}, err
		}
	}
}

// registerIfFenced reads this node's own key (nodes/<id>) once and puts
// it back when it is gone while the session lives: a peer found this
// node's agent dead (a refused probe) and fenced it, but it is alive after
// all, so it joins again as a new node does. Next calls it only when the
// keys it follows anyway say it may have been fenced (a round that left it
// out, or opened for its loss), so that an agent follows three keys, not
// four. It reports false, having read nothing, while the session is lost:
// the session puts its keys back itself when it is re-established under a
// new lease, and Next asks again once it is live (the view is poked).
func (e *Elastic) registerIfFenced(ctx context.Context) (bool, error) {
	if sess, _ := e.store.Session(); !sess.Live {
		return false, nil
	}
	kvs, _, err := e.store.List(ctx, nodeKey(e.cfg.Self.ID), 0)
	if err != nil || len(kvs) > 0 {
		return err == nil, err
	}
	e.log.Warn().Msg("this node's registration was removed (a peer found its agent dead): registering again")
	return true, e.put(ctx, nodeKey(e.cfg.Self.ID), e.cfg.Self, true)
}

// RunsWithout says whether the job runs a round that this node has no
// place in, so that Next would have it wait for a later one (a spare over
// the maximum of nodes, a late or replacement node): its agent can get
// its workers ready meanwhile. It waits for this node's first view of the
// job's state, until ctx ends; false when the job has not started, is
// between rounds or closed, or when ctx ends first.
func (e *Elastic) RunsWithout(ctx context.Context) bool {
	for {
		snap, changed := e.agent.read()
		if snap.stateRead {
			st, p := snap.state, snap.placement
			member := p.Round == st.Round && p.Member
			return snap.stateRev != 0 && st.Phase == PhaseRunning && st.Round > e.last && !member
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

// Connected says whether this node's session with the store is live (etcd
// answers): only then can it learn of a round change.
func (e *Elastic) Connected() bool {
	sess, _ := e.store.Session()
	return sess.Live
}

// Reform ends round r for a world that broke with no node lost (a one-way
// or partial network fault: every lease renews, but some workers cannot
// reach others), by opening the next round as a membership change: the
// same members join it again, and agents that keep their workers in place
// re-form them without losing a step. It spends the membership-change
// budget (the job closes as failed when it is spent). When the job
// already moved past r it does nothing; the round's watchers learn of the
// new round as of any other.
func (e *Elastic) Reform(ctx context.Context, r Round, reason string) error {
	snap, _ := e.agent.read()
	st := snap.state
	if _, over := roundOver(st, r); over {
		return nil
	}
	return e.cas(ctx, snap.stateRev, st, st.Next(CauseMembership, reason, e.cfg.Limits, time.Now()))
}

// recordLost writes a failure report for each lost node of round, with
// the global ranks it held: its death is what broke its peers' workers, so
// OrderFailures puts it before them.
func (e *Elastic) recordLost(ctx context.Context, round int, members, lost []Member) error {
	for _, m := range lost {
		f := Failure{Host: m.Host, NodeRank: -1, Rank: -1, ExitCode: 137, Signal: "node lost", Time: time.Now(), Attempt: round,
			Ranks: ranksOf(members, m.ID),
			Error: fmt.Sprintf("node %s stopped answering: its lease expired or its agent refused a peer's probe (the node died, or was cut off)", m.Host)}
		if err := e.put(ctx, nodeFailureKey(round, m.ID), f, false); err != nil {
			return err
		}
	}
	return nil
}

// ranksOf lists the global ranks member id held among members, which are
// in node-rank order.
func ranksOf(members []Member, id string) []int {
	var ranks []int
	first := 0
	for _, m := range members {
		if m.ID == id {
			for i := range m.NProc {
				ranks = append(ranks, first+i)
			}
		}
		first += m.NProc
	}
	return ranks
}

// Succeeded reports that every worker of this node exited 0 in round r and
// waits for the others: once every member did, the aggregator closes the
// job as succeeded. If instead a node fails or leaves, the round ends
// another way and this node must join the next one. It returns how round
// r ended.
func (e *Elastic) Succeeded(ctx context.Context, r Round) (End, error) {
	if err := e.put(ctx, doneKey(r.Number, e.cfg.Self.ID), e.cfg.Self.Host, true); err != nil {
		return End{}, err
	}
	for {
		snap, changed := e.agent.read()
		if end, over := roundOver(snap.state, r); over {
			return end, nil
		}
		if err := e.await(ctx, changed); err != nil {
			return End{}, err
		}
	}
}

// await blocks until the view changes or ctx ends; it fails with
// ErrEtcdUnreachable once etcd has been away for JoinTimeout.
func (e *Elastic) await(ctx context.Context, changed <-chan struct{}) error {
	select {
	case <-changed:
		return e.outageTooLong()
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Failures returns the first failures any node reported, first first:
// every agent reads them when the job failed, so it reads a bounded number
// whatever the job's size (see failureKey).
func (e *Elastic) Failures(ctx context.Context) ([]Failure, error) {
	kvs, _, err := e.store.List(ctx, PrefixFail, MaxListedFailures)
	if err != nil {
		return nil, err
	}
	return DecodeFailures(kvs), nil
}

// RecordRecovery keeps rec in etcd (one unleased key per recovery, read by
// gorun status): call it once per in-place recovery, from one node.
func (e *Elastic) RecordRecovery(ctx context.Context, rec Recovery) error {
	return e.put(ctx, keptKey(rec.Round), rec, false)
}
