package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/internal/broadcast"
	"github.com/gorun/gorun/rendezvous"
)

// restorePoll is how often a lost session asks etcd again.
const restorePoll = 250 * time.Millisecond

// etcdSession keeps one agent's lease alive across etcd outages. It
// remembers the keys put under the lease so that, when the lease expired
// during an outage, it can put them again under a new one.
type etcdSession struct {
	client *clientv3.Client
	kv     clientv3.KV // the job's namespace
	ttl    int64       // seconds

	mu      sync.Mutex
	lease   clientv3.LeaseID
	leased  map[string]string // key -> the value last put under the lease
	state   rendezvous.Session
	changed broadcast.Signal // notified when state changes
	// recheck tells the keeper to leave its keep-alives: CheckSession
	// found the lease gone. Sent to and drained under mu.
	recheck chan struct{}

	cancel context.CancelFunc
	done   chan struct{} // the keeper has returned
}

// newEtcdSession grants a lease of ttl seconds (retried as retry does)
// and keeps it alive until close.
func newEtcdSession(ctx context.Context, client *clientv3.Client, kv clientv3.KV, ttl int64, patience time.Duration) (*etcdSession, error) {
	var grant *clientv3.LeaseGrantResponse
	err := retry(ctx, patience, func(ctx context.Context) (err error) {
		grant, err = client.Grant(ctx, ttl)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("rendezvous: grant a lease: %w", err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	s := &etcdSession{
		client: client, kv: kv, ttl: ttl,
		lease: grant.ID, leased: map[string]string{},
		state:   rendezvous.Session{Live: true, Since: time.Now()},
		recheck: make(chan struct{}, 1),
		cancel:  cancel, done: make(chan struct{}),
	}
	go s.keep(kctx)
	return s, nil
}

// keep keeps the lease alive, and re-establishes the session each time
// it is lost, until ctx ends.
func (s *etcdSession) keep(ctx context.Context) {
	defer close(s.done)
	for {
		s.keepAlive(ctx)
		if ctx.Err() != nil {
			return
		}
		s.lost()
		if !s.restore(ctx) {
			return
		}
	}
}

// keepAlive sends keep-alives until they go unanswered for the TTL (the
// client then closes the channel), etcd says the lease is gone,
// CheckSession found it gone, or ctx ends.
func (s *etcdSession) keepAlive(ctx context.Context) {
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	answers, err := s.client.KeepAlive(kctx, s.leaseID())
	if err != nil {
		return
	}
	for {
		select {
		case _, ok := <-answers:
			if !ok {
				return
			}
		case <-s.recheck:
			return
		}
	}
}

// restore asks etcd until it answers and re-establishes the session. It
// reports false when ctx ended first.
func (s *etcdSession) restore(ctx context.Context) bool {
	for {
		renewed, err := s.reestablish(ctx)
		if err == nil {
			s.live(renewed)
			return true
		}
		select {
		case <-time.After(restorePoll):
		case <-ctx.Done():
			return false
		}
	}
}

// reestablish keeps the lease if etcd still holds it; else it grants a
// new one and puts every leased key again under it, and only then uses
// it for new puts (a put that raced with it fails on the old lease and is
// retried on the new one, so the newest value wins). It reports whether
// the lease is new.
func (s *etcdSession) reestablish(ctx context.Context) (bool, error) {
	ttl, err := call(ctx, func(ctx context.Context) (*clientv3.LeaseTimeToLiveResponse, error) {
		return s.client.TimeToLive(ctx, s.leaseID())
	})
	switch {
	case err == nil && ttl.TTL > 0:
		return false, nil
	case err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound):
		return false, err
	}
	grant, err := call(ctx, func(ctx context.Context) (*clientv3.LeaseGrantResponse, error) {
		return s.client.Grant(ctx, s.ttl)
	})
	if err != nil {
		return false, err
	}
	for _, key := range s.leasedKeys() {
		value, ok := s.leasedValue(key)
		if !ok {
			continue
		}
		if _, err := call(ctx, func(ctx context.Context) (*clientv3.PutResponse, error) {
			return s.kv.Put(ctx, key, value, clientv3.WithLease(grant.ID))
		}); err != nil {
			return false, err
		}
		if _, still := s.leasedValue(key); !still {
			// Deleted while it was being put again: delete it again.
			if _, err := call(ctx, func(ctx context.Context) (*clientv3.DeleteResponse, error) {
				return s.kv.Delete(ctx, key)
			}); err != nil {
				return false, err
			}
		}
	}
	s.mu.Lock()
	s.lease = grant.ID
	s.mu.Unlock()
	return true, nil
}

// call runs one attempt of f bounded by callTimeout.
func call[T any](ctx context.Context, f func(ctx context.Context) (T, error)) (T, error) {
	actx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return f(actx)
}

// check asks etcd whether the lease lives; when it does not, or etcd does
// not answer in time, the session is lost from now on.
func (s *etcdSession) check(ctx context.Context) bool {
	if st, _ := s.snapshot(); !st.Live {
		return false
	}
	ttl, err := call(ctx, func(ctx context.Context) (*clientv3.LeaseTimeToLiveResponse, error) {
		return s.client.TimeToLive(ctx, s.leaseID())
	})
	if err == nil && ttl.TTL > 0 {
		return true
	}
	if ctx.Err() != nil {
		return false // the caller gave up: that says nothing about the lease
	}
	s.lost()
	return false
}

// lost marks the session lost and, the first time, tells the keeper.
func (s *etcdSession) lost() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.state.Live {
		return
	}
	s.state = rendezvous.Session{Live: false, Since: time.Now(), Outages: s.state.Outages + 1, Renewed: s.state.Renewed}
	select {
	case s.recheck <- struct{}{}:
	default:
	}
	s.notifyLocked()
}

// live marks the session re-established.
func (s *etcdSession) live(renewed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.recheck: // the loss it reported is the one just repaired
	default:
	}
	s.state = rendezvous.Session{Live: true, Since: time.Now(), Outages: s.state.Outages, Renewed: renewed}
	s.notifyLocked()
}

func (s *etcdSession) notifyLocked() {
	s.changed.Notify()
}

func (s *etcdSession) snapshot() (rendezvous.Session, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state, s.changed.Changed()
}

func (s *etcdSession) leaseID() clientv3.LeaseID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lease
}

// remember records a leased put, before it is sent.
func (s *etcdSession) remember(key, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leased[key] = value
}

// forget records a delete, before it is sent.
func (s *etcdSession) forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.leased, key)
}

// leasedKeys returns the leased keys in order: node keys (nodes/...)
// sort first, so the others see this agent alive again soonest.
func (s *etcdSession) leasedKeys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.leased))
	for k := range s.leased {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func (s *etcdSession) leasedValue(key string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.leased[key]
	return v, ok
}

// close stops the keeper and revokes the lease, which deletes its keys.
// A lease etcd no longer holds is no error.
// releaseTimeout bounds the release of the lease when the session closes.
const releaseTimeout = time.Second

func (s *etcdSession) close() error {
	s.cancel()
	<-s.done
	// Releasing the lease only spares the others waiting out its TTL: an
	// etcd that cannot answer at once (it lost its quorum) must not hold
	// up this agent's exit.
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	_, err := s.client.Revoke(ctx, s.leaseID())
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("rendezvous: release lease: %w", err)
	}
	return nil
}
