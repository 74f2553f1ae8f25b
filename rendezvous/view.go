package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
)

// view is one agent's copy of its job's keys, kept current by one watch on
// the job's prefix. Readers take what they need under the lock and wait on
// the channel that closes at the next change.
type view struct {
	mu      sync.Mutex
	kvs     map[string]KV
	changed chan struct{}
}

func newView() *view {
	return &view{kvs: map[string]KV{}, changed: make(chan struct{})}
}

// run keeps v current until ctx ends: list, watch from there, and list
// again whenever the watch breaks.
func (v *view) run(ctx context.Context, store Store) {
	for ctx.Err() == nil {
		kvs, rev, err := store.List(ctx, "")
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

func (v *view) reset(kvs []KV) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.kvs = make(map[string]KV, len(kvs))
	for _, kv := range kvs {
		v.kvs[kv.Key] = kv
	}
	v.notifyLocked()
}

func (v *view) apply(ev Event) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if ev.Deleted {
		delete(v.kvs, ev.Key)
	} else {
		v.kvs[ev.Key] = ev.KV
	}
	v.notifyLocked()
}

func (v *view) notifyLocked() {
	close(v.changed)
	v.changed = make(chan struct{})
}

// snapshot is what the protocol reads from the view at one moment.
type snapshot struct {
	state    State
	stateRev int64 // 0: no state key yet
	joined   []Member
	alive    map[string]bool // node ids with a live session
	waiting  []Member
	done     map[string]bool // members whose workers succeeded in the state's round
}

// Keys of a job, relative to its prefix.
const (
	keyState    = "state"
	prefixNodes = "nodes/"
	prefixWait  = "waiting/"
	prefixFail  = "failures/"
)

func roundPrefix(round int) string        { return fmt.Sprintf("rounds/%08d/", round) }
func joinKey(round int, id string) string { return roundPrefix(round) + "join/" + id }
func doneKey(round int, id string) string { return roundPrefix(round) + "done/" + id }

// read returns a snapshot and the channel that closes at the next change.
// Malformed values are skipped: only this package writes them.
func (v *view) read() (snapshot, <-chan struct{}) {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := snapshot{alive: map[string]bool{}, done: map[string]bool{}}
	if kv, ok := v.kvs[keyState]; ok && json.Unmarshal(kv.Value, &s.state) == nil {
		s.stateRev = kv.Rev
	}
	join, done := roundPrefix(s.state.Round)+"join/", roundPrefix(s.state.Round)+"done/"
	for k, kv := range v.kvs {
		switch {
		case strings.HasPrefix(k, prefixNodes):
			s.alive[strings.TrimPrefix(k, prefixNodes)] = true
		case strings.HasPrefix(k, join):
			var m Member
			if json.Unmarshal(kv.Value, &m) == nil {
				// Join order is the order agents joined the job, not this
				// round, so node ranks stay put across rounds.
				m.Order = kv.Create
				if node, ok := v.kvs[prefixNodes+m.ID]; ok {
					m.Order = node.Create
				}
				s.joined = append(s.joined, m)
			}
		case strings.HasPrefix(k, done):
			s.done[strings.TrimPrefix(k, done)] = true
		case strings.HasPrefix(k, prefixWait):
			var m Member
			if json.Unmarshal(kv.Value, &m) == nil {
				s.waiting = append(s.waiting, m)
			}
		}
	}
	return s, v.changed
}
