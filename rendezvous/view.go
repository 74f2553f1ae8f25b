package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
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

// applyLocked decodes one change into the view. Malformed values are
// skipped: only this package writes them.
func (v *view) applyLocked(ev Event) {
	key := ev.Key
	switch {
	case key == keyState:
		var st State
		if !ev.Deleted && json.Unmarshal(ev.Value, &st) == nil {
			v.state, v.stateRev = st, ev.Rev
			v.forgetRoundsBefore(st.Round)
		} else if ev.Deleted {
			v.state, v.stateRev = State{}, 0
		}
	case key == keyRoster && !ev.Deleted:
		if r, err := DecodeRoster(ev.Value); err == nil {
			v.roster = r
			// A new aggregator learns the join order of the members
			// from the roster, so node ranks stay put when it takes
			// over.
			for _, m := range r.Members {
				v.order[m.ID] = m.Order
			}
		}
	case strings.HasPrefix(key, prefixNodes):
		id := strings.TrimPrefix(key, prefixNodes)
		if ev.Deleted {
			delete(v.nodes, id)
		} else {
			v.nodes[id] = ev.Create
			if _, seen := v.order[id]; !seen {
				v.order[id] = ev.Create
			}
		}
	case strings.HasPrefix(key, prefixWait):
		id := strings.TrimPrefix(key, prefixWait)
		var m Member
		if ev.Deleted {
			delete(v.waiting, id)
		} else if json.Unmarshal(ev.Value, &m) == nil {
			v.waiting[id] = m
		}
	case strings.HasPrefix(key, "rounds/"):
		var round int
		var kind, id string
		rest := strings.TrimPrefix(key, "rounds/")
		r, tail, _ := strings.Cut(rest, "/")
		kind, id, _ = strings.Cut(tail, "/")
		if _, err := fmt.Sscanf(r, "%d", &round); err != nil {
			return
		}
		switch kind {
		case "join":
			if v.joined[round] == nil {
				v.joined[round] = map[string]Member{}
			}
			var m Member
			if ev.Deleted {
				delete(v.joined[round], id)
			} else if json.Unmarshal(ev.Value, &m) == nil {
				m.Order = ev.Create
				v.joined[round][id] = m
			}
		case "done":
			if v.done[round] == nil {
				v.done[round] = map[string]bool{}
			}
			if ev.Deleted {
				delete(v.done[round], id)
			} else {
				v.done[round][id] = true
			}
		case "unreach":
			if v.unreach[round] == nil {
				v.unreach[round] = map[string][]string{}
			}
			var ids []string
			if ev.Deleted {
				delete(v.unreach[round], id)
			} else if json.Unmarshal(ev.Value, &ids) == nil {
				v.unreach[round][id] = ids
			}
		case "stall":
			if v.stalls[round] == nil {
				v.stalls[round] = map[string]int64{}
			}
			if ev.Deleted {
				delete(v.stalls[round], id)
			} else {
				v.stalls[round][id] = ev.Create
			}
		}
	}
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

// Keys of a job, relative to its prefix.
const (
	keyState    = "state"    // State: every agent watches it
	keyLeader   = "leader"   // the aggregator's id, under its lease
	keyRoster   = "roster"   // Roster of the last round that froze
	prefixPlace = "place/"   // place/<bucket>: the Bucket of placements, each watched by its nodes only
	prefixNodes = "nodes/"   // nodes/<id>: Member, leased: the node's liveness
	prefixWait  = "waiting/" // waiting/<id>: Member, leased: a node waiting for a round
	prefixFail  = "failures/"
	prefixKept  = "inplace/" // inplace/<round>: Recovery, unleased: one per in-place recovery
)

func placeKey(bucket int) string { return fmt.Sprintf("%s%02d", prefixPlace, bucket) }

func roundPrefix(round int) string         { return fmt.Sprintf("rounds/%08d/", round) }
func joinKey(round int, id string) string  { return roundPrefix(round) + "join/" + id }
func doneKey(round int, id string) string  { return roundPrefix(round) + "done/" + id }
func stallKey(round int, id string) string { return roundPrefix(round) + "stall/" + id }
func unreachKey(round int, id string) string {
	return roundPrefix(round) + "unreach/" + id
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
