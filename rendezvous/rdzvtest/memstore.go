// Package rdzvtest is an in-memory rendezvous.Store for tests of the
// protocol and the agent: one Backend plays etcd, each agent gets its own
// Store (its own lease), and Kill plays a lease that expired.
package rdzvtest

import (
	"context"
	"strings"
	"sync"

	"github.com/gorun/gorun/rendezvous"
)

// Backend is the shared key space: etcd, in memory. Safe for concurrent use.
type Backend struct {
	mu      sync.Mutex
	rev     int64
	kvs     map[string]rendezvous.KV
	leaseOf map[string]*Store // leased key -> its owner
	history []rendezvous.Event
	wake    chan struct{} // closed and replaced on every change
	retains int           // calls of Retain
}

// NewBackend returns an empty key space at revision 1.
func NewBackend() *Backend {
	return &Backend{rev: 1, kvs: map[string]rendezvous.KV{}, leaseOf: map[string]*Store{}, wake: make(chan struct{})}
}

// Store returns a new agent's view of the backend, with its own session.
func (b *Backend) Store() *Store {
	return &Store{b: b, done: make(chan struct{})}
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
	close(b.wake)
	b.wake = make(chan struct{})
}

// Store is one agent's session on a Backend.
type Store struct {
	b        *Backend
	once     sync.Once
	done     chan struct{}
	mu       sync.Mutex
	lostFlag bool
}

var _ rendezvous.Store = (*Store)(nil)

func (s *Store) lost() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lostFlag
}

// List implements rendezvous.Store.
func (s *Store) List(ctx context.Context, prefix string) ([]rendezvous.KV, int64, error) {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	var out []rendezvous.KV
	for k, kv := range s.b.kvs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, kv)
		}
	}
	return out, s.b.rev, ctx.Err()
}

// CompareAndSwap implements rendezvous.Store.
func (s *Store) CompareAndSwap(ctx context.Context, key string, rev int64, value []byte) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if s.b.kvs[key].Rev != rev {
		return false, nil
	}
	s.b.changeLocked(key, value, false, nil)
	return true, nil
}

// Put implements rendezvous.Store. A leased put after the session was lost
// is dropped, as etcd refuses a put under an expired lease.
func (s *Store) Put(ctx context.Context, key string, value []byte, leased bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if leased && s.lost() {
		return context.Canceled
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
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if _, ok := s.b.kvs[key]; ok {
		s.b.changeLocked(key, nil, true, nil)
	}
	return ctx.Err()
}

// Watch implements rendezvous.Store.
func (s *Store) Watch(ctx context.Context, prefix string, rev int64) <-chan rendezvous.Event {
	out := make(chan rendezvous.Event)
	go func() {
		defer close(out)
		next := rev + 1
		for {
			s.b.mu.Lock()
			var batch []rendezvous.Event
			for _, e := range s.b.history {
				if e.Rev >= next && strings.HasPrefix(e.Key, prefix) {
					batch = append(batch, e)
				}
			}
			next = s.b.rev + 1
			wake := s.b.wake
			s.b.mu.Unlock()
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

// Done implements rendezvous.Store.
func (s *Store) Done() <-chan struct{} { return s.done }

// Kill plays a lease that expired: the agent's leased keys disappear and
// Done closes, as when its node dies.
func (s *Store) Kill() {
	s.once.Do(func() {
		s.mu.Lock()
		s.lostFlag = true
		s.mu.Unlock()
		s.b.mu.Lock()
		for k, owner := range s.b.leaseOf {
			if owner == s {
				s.b.changeLocked(k, nil, true, nil)
			}
		}
		s.b.mu.Unlock()
		close(s.done)
	})
}

// Close implements rendezvous.Store: the lease is released.
func (s *Store) Close() error {
	s.Kill()
	return nil
}
