package rendezvous

import (
	"context"
	"sync"
	"time"

	"github.com/gorun/gorun/internal/broadcast"
)

// view is the aggregator's copy of its job's keys, kept current by one
// watch on the job's prefix: only the agent that leads follows every
// node's keys (the others follow three keys each, see agentView). Each key is decoded once, when it changes; readers take
// a snapshot under the lock and wait on the channel that closes at the
// next change.
type view struct {
	mu       sync.Mutex
	loaded   bool // the first list is in
	state    State
	stateRev int64            // 0: no state key yet
	roster   Roster           // the last round that froze
	nodes    map[string]int64 // node id -> create revision of its live node key
	// order is each node's join order: the create revision of the first
	// node key this view saw of it. It survives the node putting its key
	// again under a new lease after an etcd outage, and lists of the
	// keys, so node ranks stay put.
	order   map[string]int64
	joined  map[int]map[string]Member   // round -> id -> member, Order = its join key's revision
	done    map[int]map[string]bool     // round -> ids whose workers succeeded
	stalls  map[int]map[string]int64    // round -> ids whose workers stalled -> revision of the report
	unreach map[int]map[string][]string // round -> id -> the members it cannot reach (Elastic.Unreachable)
	waiting map[string]Member
	changed broadcast.Signal
}

func newView() *view {
	v := &view{order: map[string]int64{}}
	v.clearLocked()
	return v
}

func (v *view) clearLocked() {
	v.state, v.stateRev, v.roster = State{}, 0, Roster{Round: -1}
	v.nodes = map[string]int64{}
	v.joined = map[int]map[string]Member{}
	v.done = map[int]map[string]bool{}
	v.stalls = map[int]map[string]int64{}
	v.unreach = map[int]map[string][]string{}
	v.waiting = map[string]Member{}
}

// run keeps v current until ctx ends: list, watch from there, and list
// again whenever the watch breaks.
func (v *view) run(ctx context.Context, store Store) {
	for ctx.Err() == nil {
		kvs, rev, err := store.List(ctx, "", 0)
		if err != nil {
			select {
			case <-time.After(100 * time.Millisecond):
				continue
			case <-ctx.Done():
				return
			}
		}
		v.reset(kvs)
		for ev := range store.Watch(ctx, "", rev) {
			v.apply(ev)
		}
	}
}

func (v *view) apply(ev Event) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.applyLocked(ev)
	v.notifyLocked()
}

func (v *view) reset(kvs []KV) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.clearLocked()
	for _, kv := range kvs {
		v.applyLocked(Event{KV: kv})
	}
	v.loaded = true
	v.notifyLocked()
}

// applyLocked decodes one change into the view. Keys of no kind and
// malformed values are skipped: only this package writes them.
func (v *view) applyLocked(ev Event) {
	k, ok := ParseKey(ev.Key)
	if !ok {
		return
	}
	// Only the values the view keeps are decoded: of the others (a node's
	// registration, a round's done and stall marks) the key is the news,
	// and the rest (placements, failures, stats) the view does not follow.
	var val any
	switch k.Kind {
	case KindState, KindRoster, KindWaiting, KindJoin, KindUnreach:
		if !ev.Deleted {
			var err error
			if val, err = Decode(k, ev.KV); err != nil {
				return
			}
		}
	}
	switch k.Kind {
	case KindState:
		if ev.Deleted {
			v.state, v.stateRev = State{}, 0
			return
		}
		v.state, v.stateRev = val.(State), ev.Rev
		v.forgetRoundsBefore(v.state.Round)
	case KindRoster:
		if ev.Deleted {
			return
		}
		v.roster = val.(Roster)
		// A new aggregator learns the join order of the members from the
		// roster, so node ranks stay put when it takes over.
		for _, m := range v.roster.Members {
			v.order[m.ID] = m.Order
		}
	case KindNode:
		if ev.Deleted {
			delete(v.nodes, k.ID)
			return
		}
		v.nodes[k.ID] = ev.Create
		if _, seen := v.order[k.ID]; !seen {
			v.order[k.ID] = ev.Create
		}
	case KindWaiting:
		if ev.Deleted {
			delete(v.waiting, k.ID)
			return
		}
		v.waiting[k.ID] = val.(Member)
	case KindJoin:
		joined := roundEntry(v.joined, k.Round)
		if ev.Deleted {
			delete(joined, k.ID)
			return
		}
		m := val.(Member)
		m.Order = ev.Create
		joined[k.ID] = m
	case KindDone:
		done := roundEntry(v.done, k.Round)
		if ev.Deleted {
			delete(done, k.ID)
			return
		}
		done[k.ID] = true
	case KindUnreach:
		unreach := roundEntry(v.unreach, k.Round)
		if ev.Deleted {
			delete(unreach, k.ID)
			return
		}
		unreach[k.ID] = val.([]string)
	case KindStall:
		stalls := roundEntry(v.stalls, k.Round)
		if ev.Deleted {
			delete(stalls, k.ID)
			return
		}
		stalls[k.ID] = ev.Create
	}
}

// roundEntry is m's map of round, made when it has none.
func roundEntry[V any](m map[int]map[string]V, round int) map[string]V {
	if m[round] == nil {
		m[round] = map[string]V{}
	}
	return m[round]
}

// forgetRoundsBefore drops what the view holds of rounds before round:
// the aggregator reads only the state's round, and a long job of thousands
// of nodes would otherwise keep every round's joiners in memory.
func (v *view) forgetRoundsBefore(round int) {
	forgetBefore(v.joined, round)
	forgetBefore(v.done, round)
	forgetBefore(v.stalls, round)
	forgetBefore(v.unreach, round)
}

// forgetBefore deletes the entries of m for rounds before round.
func forgetBefore[V any](m map[int]V, round int) {
	for r := range m {
		if r < round {
			delete(m, r)
		}
	}
}

// poke wakes the readers waiting for a change without changing anything:
// something they also depend on (the session) changed.
func (v *view) poke() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.notifyLocked()
}

func (v *view) notifyLocked() {
	v.changed.Notify()
}

// snapshot is what the protocol reads from the view at one moment.
type snapshot struct {
	loaded   bool // false until the view's first list is in: nothing else is known
	state    State
	stateRev int64  // 0: no state key yet
	roster   Roster // the last round that froze: the state's own when running, else the one before
	joined   []Member
	alive    map[string]bool // node ids with a live session
	waiting  []Member
	done     map[string]bool     // members whose workers succeeded in the state's round
	stalls   map[string]int64    // members whose workers stalled in the state's round -> revision
	unreach  map[string][]string // members of the state's round -> the members they cannot reach
}

// read returns a snapshot and the channel that closes at the next change.
func (v *view) read() (snapshot, <-chan struct{}) {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := snapshot{loaded: v.loaded, state: v.state, stateRev: v.stateRev, roster: v.roster, alive: make(map[string]bool, len(v.nodes)), done: map[string]bool{}, stalls: map[string]int64{}}
	for id := range v.nodes {
		s.alive[id] = true
	}
	s.joined = make([]Member, 0, len(v.joined[v.state.Round]))
	for id, m := range v.joined[v.state.Round] {
		// Join order is the order agents joined the job, not this round,
		// so node ranks stay put across rounds.
		if order, ok := v.order[id]; ok {
			m.Order = order
		}
		s.joined = append(s.joined, m)
	}
	for id := range v.done[v.state.Round] {
		s.done[id] = true
	}
	for id, rev := range v.stalls[v.state.Round] {
		s.stalls[id] = rev
	}
	s.unreach = make(map[string][]string, len(v.unreach[v.state.Round]))
	for id, ids := range v.unreach[v.state.Round] {
		s.unreach[id] = ids
	}
	for _, m := range v.waiting {
		s.waiting = append(s.waiting, m)
	}
	return s, v.changed.Changed()
}
