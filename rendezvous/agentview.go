package rendezvous

import (
	"context"
	"sync"
	"time"

	"github.com/gorun/gorun/internal/broadcast"
)

// agentView is what one agent follows of its job: the state key, the
// leader key and its placement bucket, three keys whatever the job's size,
// so a round costs it a handful of watch events. Each key is decoded once,
// when it changes; readers take a snapshot under the lock and wait on the
// channel that closes at the next change.
type agentView struct {
	self string

	mu        sync.Mutex
	state     State
	stateRev  int64  // 0: no state key yet
	stateRead bool   // the state key was read (or found absent) once
	leader    string // the aggregator's id; "" while there is none
	led       bool   // the leader key was read: leader is known
	placement Placement
	placed    bool // a placement was read
	changed   broadcast.Signal
}

func newAgentView(self string) *agentView {
	return &agentView{self: self}
}

// run keeps v current until ctx ends. It follows three keys and no
// more (bench/rendezvous.sh's smoke fails on a fourth): a node whose own
// key a peer deleted learns it from these (Elastic.Next).
func (v *agentView) run(ctx context.Context, store Store) {
	var wg sync.WaitGroup
	for _, key := range []string{KeyState, KeyLeader, placeKey(BucketOf(v.self))} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			followKey(ctx, store, key, v.apply)
		}()
	}
	wg.Wait()
}

// followKey calls apply with every value key takes (present false: it
// does not exist) until ctx ends: get it, watch it from there, and get it
// again whenever the watch breaks.
func followKey(ctx context.Context, store Store, key string, apply func(kv KV, present bool)) {
	for ctx.Err() == nil {
		kvs, rev, err := store.List(ctx, key, 0)
		if err != nil {
			select {
			case <-time.After(100 * time.Millisecond):
				continue
			case <-ctx.Done():
				return
			}
		}
		if len(kvs) == 0 {
			apply(KV{Key: key}, false)
		} else {
			apply(kvs[0], true)
		}
		for ev := range store.Watch(ctx, key, rev) {
			apply(ev.KV, !ev.Deleted)
		}
	}
}

// apply takes one key's value, or its absence, into the view. Malformed
// values are skipped: only this package writes them.
func (v *agentView) apply(kv KV, present bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	defer v.notifyLocked()
	k, ok := ParseKey(kv.Key)
	if !ok {
		return
	}
	var val any
	if present {
		var err error
		if val, err = Decode(k, kv); err != nil {
			val = nil
		}
	}
	switch k.Kind {
	case KindState:
		v.stateRead = true
		switch st, ok := val.(State); {
		case !present:
			v.state, v.stateRev = State{}, 0
		case ok:
			v.state, v.stateRev = st, kv.Rev
		}
	case KindLeader:
		v.leader, v.led = "", true
		if present {
			v.leader = val.(string)
		}
	case KindPlace:
		b, ok := val.(Bucket)
		if !ok || k.Bucket != BucketOf(v.self) {
			break
		}
		// Not in its bucket's round: this node did not join that round,
		// or joined after it froze.
		p, ok := b.Places[v.self]
		if !ok {
			p = Placement{Member: false, NodeRank: -1, FirstRank: -1}
		}
		p.Round = b.Round
		v.placement, v.placed = p, true
	}
}

// poke wakes the readers waiting for a change without changing anything:
// something they also depend on (the session) changed.
func (v *agentView) poke() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.notifyLocked()
}

func (v *agentView) notifyLocked() {
	v.changed.Notify()
}

// agentSnapshot is what the agent reads from its view at one moment.
type agentSnapshot struct {
	state     State
	stateRev  int64 // 0: no state key yet
	stateRead bool  // the state key was read once: stateRev 0 means there is none
	leader    string
	led       bool      // leader is known (the leader key was read)
	placement Placement // Round is -1 when none was read
}

// read returns a snapshot and the channel that closes at the next change.
func (v *agentView) read() (agentSnapshot, <-chan struct{}) {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := agentSnapshot{state: v.state, stateRev: v.stateRev, stateRead: v.stateRead, leader: v.leader, led: v.led, placement: v.placement}
	if !v.placed {
		s.placement = Placement{Round: -1, NodeRank: -1, FirstRank: -1}
	}
	return s, v.changed.Changed()
}
