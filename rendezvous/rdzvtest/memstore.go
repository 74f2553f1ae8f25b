// Package rdzvtest is an in-memory rendezvous.Store for tests of the
// protocol and the agent: one Backend plays etcd, each agent gets its own
// Store (its own lease), Kill plays a lease that expired, and Outage and
// Restore play an etcd outage that outlived the lease.
package rdzvtest

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gorun/gorun/internal/broadcast"
	"github.com/gorun/gorun/rendezvous"
)

// Backend is the shared key space: etcd, in memory. Safe for concurrent use.
type Backend struct {
	mu      sync.Mutex
	rev     int64
	kvs     map[string]rendezvous.KV
	leaseOf map[string]*Store // leased key -> its owner
	history []rendezvous.Event
	wake    broadcast.Signal // notified on every change
	retains int              // calls of Retain
}

// NewBackend returns an empty key space at revision 1.
func NewBackend() *Backend {
	return &Backend{rev: 1, kvs: map[string]rendezvous.KV{}, leaseOf: map[string]*Store{}}
}

// Store returns a new agent's view of the backend, with its own session.
func (b *Backend) Store() *Store {
	up := make(chan struct{})
	close(up)
	return &Store{b: b, leased: map[string][]byte{}, session: rendezvous.Session{Live: true, Since: time.Now()},
		up: up}
}

// Value returns the current value of key, for assertions.
func (b *Backend) Value(key string) ([]byte, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	kv, ok := b.kvs[key]
	return kv.Value, ok
}

// Retains returns how often an agent asked to retain the job's keys.
func (b *Backend) Retains() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.retains
}

// changeLocked records one change; the caller holds b.mu.
func (b *Backend) changeLocked(key string, value []byte, deleted bool, owner *Store) {
	b.rev++
	kv := rendezvous.KV{Key: key, Value: value, Rev: b.rev, Create: b.rev}
	if old, ok := b.kvs[key]; ok && !deleted {
		kv.Create = old.Create
	}
	if deleted {
		delete(b.kvs, key)
		delete(b.leaseOf, key)
	} else {
		b.kvs[key] = kv
		if owner != nil {
			b.leaseOf[key] = owner
		} else {
			delete(b.leaseOf, key)
		}
	}
	b.history = append(b.history, rendezvous.Event{KV: kv, Deleted: deleted})
	b.wake.Notify()
}

// Store is one agent's session on a Backend.
type Store struct {
	b        *Backend
	mu       sync.Mutex
	lostFlag bool               // killed: its lease is gone for good
	leased   map[string][]byte  // leased keys put and not deleted
	session  rendezvous.Session // as Session reports it
	changed  broadcast.Signal   // notified at the session's next change
	up       chan struct{}      // closed while the session is live
}

var _ rendezvous.Store = (*Store)(nil)

func (s *Store) lost() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lostFlag
}

// matches says whether key is keyOrPrefix, or under it when it is a
// prefix (see rendezvous.Store).
func matches(key, keyOrPrefix string) bool {
	if rendezvous.IsPrefix(keyOrPrefix) {
		return strings.HasPrefix(key, keyOrPrefix)
	}
	return key == keyOrPrefix
}

// List implements rendezvous.Store.
func (s *Store) List(ctx context.Context, keyOrPrefix string, limit int) ([]rendezvous.KV, int64, error) {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	var out []rendezvous.KV
	for k, kv := range s.b.kvs {
		if matches(k, keyOrPrefix) {
			out = append(out, kv)
		}
	}
	slices.SortFunc(out, func(a, b rendezvous.KV) int { return strings.Compare(a.Key, b.Key) })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, s.b.rev, ctx.Err()
}

// awaitUp blocks while the session is down, as a call to an etcd that
// does not answer is retried; it returns ctx's error if ctx ends first.
func (s *Store) awaitUp(ctx context.Context) error {
	s.mu.Lock()
	up := s.up
	s.mu.Unlock()
	select {
	case <-up:
		return ctx.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Txn implements rendezvous.Store.
func (s *Store) Txn(ctx context.Context, guard string, rev int64, writes ...rendezvous.KV) (bool, error) {
	if err := s.awaitUp(ctx); err != nil {
		return false, err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if guard != "" && s.b.kvs[guard].Rev != rev {
		return false, nil
	}
	for _, w := range writes {
		s.b.changeLocked(w.Key, w.Value, false, nil)
	}
	return true, nil
}

// Claim implements rendezvous.Store.
func (s *Store) Claim(ctx context.Context, key string, value []byte) (bool, error) {
	if err := s.awaitUp(ctx); err != nil {
		return false, err
	}
	if s.lost() {
		return false, context.Canceled
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if _, taken := s.b.kvs[key]; taken {
		return false, nil
	}
	s.b.changeLocked(key, value, false, s)
	return true, nil
}

// Put implements rendezvous.Store. A leased put after the session was lost
// is dropped, as etcd refuses a put under an expired lease.
func (s *Store) Put(ctx context.Context, key string, value []byte, leased bool) error {
	if err := s.awaitUp(ctx); err != nil {
		return err
	}
	if leased && s.lost() {
		return context.Canceled
	}
	if leased {
		s.mu.Lock()
		s.leased[key] = value
		s.mu.Unlock()
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	var owner *Store
	if leased {
		owner = s
	}
	s.b.changeLocked(key, value, false, owner)
	return nil
}

// Delete implements rendezvous.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.awaitUp(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.leased, key)
	s.mu.Unlock()
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if _, ok := s.b.kvs[key]; ok {
		s.b.changeLocked(key, nil, true, nil)
	}
	return ctx.Err()
}

// Watch implements rendezvous.Store.
func (s *Store) Watch(ctx context.Context, keyOrPrefix string, rev int64) <-chan rendezvous.Event {
	out := make(chan rendezvous.Event)
	go func() {
		defer close(out)
		next := rev + 1
		for {
			s.b.mu.Lock()
			var batch []rendezvous.Event
			for _, e := range s.b.history {
				if e.Rev >= next && matches(e.Key, keyOrPrefix) {
					batch = append(batch, e)
				}
			}
			next = s.b.rev + 1
			wake := s.b.wake.Changed()
			s.b.mu.Unlock()
			// In an outage this agent hears nothing from etcd.
			if s.awaitUp(ctx) != nil {
				return
			}
			for _, e := range batch {
				select {
				case out <- e:
				case <-ctx.Done():
					return
				}
			}
			select {
			case <-wake:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// Retain implements rendezvous.Store: it only counts the call (memory
// has no leases to expire).
func (s *Store) Retain(ctx context.Context) error {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	s.b.retains++
	return ctx.Err()
}

// Session implements rendezvous.Store.
func (s *Store) Session() (rendezvous.Session, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.session, s.changed.Changed()
}

// CheckSession implements rendezvous.Store: the lease lives unless the
// store was killed or is in an outage.
func (s *Store) CheckSession(ctx context.Context) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ctx.Err() == nil && !s.lostFlag && s.session.Live
}

// Kill plays a lease that expired for good: the agent's leased keys
// disappear, as when its node dies.
func (s *Store) Kill() {
	s.mu.Lock()
	s.lostFlag = true
	s.mu.Unlock()
	s.expire()
}

// expire deletes the store's leased keys from the backend.
func (s *Store) expire() {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	for k, owner := range s.b.leaseOf {
		if owner == s {
			s.b.changeLocked(k, nil, true, nil)
		}
	}
}

// Outage plays an etcd outage that outlived this agent's lease: its
// leased keys disappear, its session is down, and its writes wait until
// Restore.
func (s *Store) Outage() {
	s.mu.Lock()
	if s.session.Live {
		s.session = rendezvous.Session{Live: false, Since: time.Now(), Outages: s.session.Outages + 1}
		s.up = make(chan struct{})
		s.notifyLocked()
	}
	s.mu.Unlock()
	s.expire()
}

// Restore ends an Outage as etcd does for a lease it expired: the store
// puts its leased keys again under a new lease, node keys first, and its
// session is live again.
func (s *Store) Restore() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.session.Live {
		return
	}
	keys := make([]string, 0, len(s.leased))
	for k := range s.leased {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	s.b.mu.Lock()
	for _, k := range keys {
		s.b.changeLocked(k, s.leased[k], false, s)
	}
	s.b.mu.Unlock()
	s.session = rendezvous.Session{Live: true, Since: time.Now(), Outages: s.session.Outages, Renewed: true}
	close(s.up)
	s.notifyLocked()
}

func (s *Store) notifyLocked() {
	s.changed.Notify()
}

// Close implements rendezvous.Store: the lease is released.
func (s *Store) Close() error {
	s.Kill()
	return nil
}
