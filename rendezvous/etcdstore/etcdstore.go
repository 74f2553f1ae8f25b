package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"

	"github.com/gorun/gorun/rendezvous"
)

// etcdStore is Store over etcd v3: keys under an incarnation's prefix
// /gorun/<run-id>/<incarnation>/, a session lease with keep-alive for
// leased keys that outlives etcd outages.
type etcdStore struct {
	conn     *Conn
	inc      Incarnation
	kv       clientv3.KV
	watcher  clientv3.Watcher
	session  *etcdSession
	patience time.Duration
}

// JobPrefix is the etcd prefix of a run id's keys: its current pointer and
// its incarnations (Incarnation.Prefix).
func JobPrefix(runID string) string { return "/gorun/" + runID + "/" }

// Option changes a default of Conn.NewStore.
type Option func(*etcdStore)

// WithPatience sets how long a call keeps retrying while etcd does not
// answer (default 20 s); the agent sets its join_timeout, so that an etcd
// outage fails a call only when it lasts that long.
func WithPatience(d time.Duration) Option {
	return func(s *etcdStore) { s.patience = d }
}

// NewStore returns the Store of one agent of incarnation inc (see
// Enter) over c, with a session whose lease lives ttl after the agent's
// last keep-alive. It waits for etcd to grant the lease as its calls do
// (see WithPatience) or until ctx ends. Closing the Store does not close
// c.
func (c *Conn) NewStore(ctx context.Context, inc Incarnation, ttl time.Duration, opts ...Option) (rendezvous.Store, error) {
	secs := int64(ttl.Round(time.Second) / time.Second)
	if secs < 1 {
		return nil, fmt.Errorf("rendezvous: lease ttl %s is under one second", ttl)
	}
	prefix := inc.Prefix()
	s := &etcdStore{
		conn:     c,
		inc:      inc,
		kv:       namespace.NewKV(c.client.KV, prefix),
		watcher:  namespace.NewWatcher(c.client.Watcher, prefix),
		patience: callPatience,
	}
	for _, opt := range opts {
		opt(s)
	}
	if s.patience <= 0 {
		return nil, fmt.Errorf("rendezvous: etcd call patience %s: want a positive duration", s.patience)
	}
	session, err := newEtcdSession(ctx, c.client, s.kv, secs, s.patience)
	if err != nil {
		return nil, err
	}
	s.session = session
	return s, nil
}

// rangeOf is the etcd option that makes keyOrPrefix a prefix when it is
// one (see rendezvous.Store).
func rangeOf(keyOrPrefix string) []clientv3.OpOption {
	if rendezvous.IsPrefix(keyOrPrefix) {
		return []clientv3.OpOption{clientv3.WithPrefix()}
	}
	return nil
}

func (s *etcdStore) List(ctx context.Context, keyOrPrefix string, limit int) ([]rendezvous.KV, int64, error) {
	opts := rangeOf(keyOrPrefix)
	if limit > 0 {
		opts = append(opts, clientv3.WithLimit(int64(limit)))
	}
	var resp *clientv3.GetResponse
	err := retry(ctx, s.patience, func(ctx context.Context) (err error) {
		resp, err = s.kv.Get(ctx, keyOrPrefix, opts...)
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("rendezvous: list %q: %w", keyOrPrefix, err)
	}
	kvs := make([]rendezvous.KV, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		kvs = append(kvs, rendezvous.KV{Key: string(kv.Key), Value: kv.Value, Rev: kv.ModRevision, Create: kv.CreateRevision})
	}
	return kvs, resp.Header.Revision, nil
}

func (s *etcdStore) Txn(ctx context.Context, guard string, rev int64, writes ...rendezvous.KV) (bool, error) {
	if len(writes) > rendezvous.MaxTxnWrites {
		return false, fmt.Errorf("rendezvous: a transaction of %d writes, over %d", len(writes), rendezvous.MaxTxnWrites)
	}
	ops := make([]clientv3.Op, len(writes))
	for i, w := range writes {
		ops[i] = clientv3.OpPut(w.Key, string(w.Value))
	}
	// A retried transaction that did commit before its answer was lost
	// reports a failed comparison the second time: the caller re-reads
	// the state and sees its own change, so that is safe.
	var resp *clientv3.TxnResponse
	err := retry(ctx, s.patience, func(ctx context.Context) (err error) {
		txn := s.kv.Txn(ctx)
		if guard != "" {
			txn = txn.If(clientv3.Compare(clientv3.ModRevision(guard), "=", rev))
		}
		resp, err = txn.Then(ops...).Commit()
		return err
	})
	if err != nil {
		return false, fmt.Errorf("rendezvous: transaction on %q: %w", guard, err)
	}
	return resp.Succeeded, nil
}

func (s *etcdStore) Claim(ctx context.Context, key string, value []byte) (bool, error) {
	var resp *clientv3.TxnResponse
	err := retry(ctx, s.patience, func(ctx context.Context) (err error) {
		resp, err = s.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, string(value), clientv3.WithLease(s.session.leaseID()))).
			Commit()
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			s.session.lost()
		}
		return err
	})
	if err != nil {
		return false, fmt.Errorf("rendezvous: claim %q: %w", key, err)
	}
	return resp.Succeeded, nil
}

func (s *etcdStore) Put(ctx context.Context, key string, value []byte, leased bool) error {
	if leased {
		s.session.remember(key, string(value))
	}
	if err := retry(ctx, s.patience, func(ctx context.Context) error {
		var opts []clientv3.OpOption
		if leased {
			// Read on every attempt: the session may have a new lease.
			opts = append(opts, clientv3.WithLease(s.session.leaseID()))
		}
		_, err := s.kv.Put(ctx, key, string(value), opts...)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			s.session.lost()
		}
		return err
	}); err != nil {
		return fmt.Errorf("rendezvous: put %q: %w", key, err)
	}
	return nil
}

func (s *etcdStore) Delete(ctx context.Context, key string) error {
	s.session.forget(key)
	if err := retry(ctx, s.patience, func(ctx context.Context) error {
		_, err := s.kv.Delete(ctx, key)
		return err
	}); err != nil {
		return fmt.Errorf("rendezvous: delete %q: %w", key, err)
	}
	return nil
}

func (s *etcdStore) Watch(ctx context.Context, keyOrPrefix string, rev int64) <-chan rendezvous.Event {
	out := make(chan rendezvous.Event, 64)
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	wch := s.watcher.Watch(wctx, keyOrPrefix, append(rangeOf(keyOrPrefix), clientv3.WithRev(rev+1))...)
	go func() {
		defer close(out)
		defer cancel()
		for resp := range wch {
			if resp.Err() != nil || resp.Canceled {
				return
			}
			for _, ev := range resp.Events {
				e := rendezvous.Event{KV: rendezvous.KV{Key: string(ev.Kv.Key), Value: ev.Kv.Value, Rev: ev.Kv.ModRevision, Create: ev.Kv.CreateRevision}, Deleted: ev.Type == clientv3.EventTypeDelete}
				select {
				case out <- e:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

func (s *etcdStore) Session() (rendezvous.Session, <-chan struct{}) { return s.session.snapshot() }

func (s *etcdStore) Retain(ctx context.Context) error {
	return s.conn.retain(ctx, s.inc, false)
}

func (s *etcdStore) CheckSession(ctx context.Context) bool { return s.session.check(ctx) }

func (s *etcdStore) Close() error { return s.session.close() }

// RetainIfDeserted attaches incarnation inc's unleased keys to a lease of
// RetentionTTL (as Store.Retain) if no agent is registered in it any more:
// the last agent to leave a run, closed or not (every agent stopped by a
// signal), sees to it that its keys go. It fails when etcd does not
// answer within ctx.
func (c *Conn) RetainIfDeserted(ctx context.Context, inc Incarnation) error {
	return c.retain(ctx, inc, true)
}

// AwaitDeparture blocks until no agent of incarnation inc is registered
// (every node released its lease, or its lease expired), or ctx ends. An
// etcd that no longer answers (the other members of its cluster have
// stopped) counts as everyone having left: nobody can use it any more.
func (c *Conn) AwaitDeparture(ctx context.Context, inc Incarnation) error {
	kv := incarnationKV(c.client, inc)
	w := namespace.NewWatcher(c.client.Watcher, inc.Prefix())
	for {
		gctx, cancel := context.WithTimeout(ctx, callTimeout)
		resp, err := kv.Get(gctx, rendezvous.PrefixNodes, clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		if err != nil {
			return nil
		}
		if resp.Count == 0 {
			return nil
		}
		wctx, cancel := context.WithCancel(ctx)
		ch := w.Watch(wctx, rendezvous.PrefixNodes, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1), clientv3.WithFilterPut())
		select {
		case <-ch:
		case <-ctx.Done():
		}
		cancel()
		if ctx.Err() != nil {
			return fmt.Errorf("rendezvous: %d node(s) still registered: %w", resp.Count, ctx.Err())
		}
	}
}

// Status is a job's rendezvous as `gorun status` shows it: the run id's
// current incarnation.
type Status struct {
	RunID string `json:"run_id"`
	// Started is false when no agent of this run id has started on this
	// etcd (or the keys of its last run expired).
	Started     bool                 `json:"started"`
	Incarnation int                  `json:"incarnation"` // the current one, 0 for the run id's first run
	Generation  int                  `json:"generation"`  // SLURM_RESTART_COUNT of the launch that started it
	Exists      bool                 `json:"exists"`      // false: the incarnation has no round yet
	State       rendezvous.State     `json:"state"`
	Roster      rendezvous.Roster    `json:"roster"`  // the members of the last round that froze
	Nodes       []rendezvous.Member  `json:"nodes"`   // agents with a live lease
	Waiting     []rendezvous.Member  `json:"waiting"` // agents waiting for the next round
	Failures    []rendezvous.Failure `json:"failures"`
	// Recoveries are the job's in-place recoveries, first first: rounds
	// that kept the workers instead of restarting them.
	Recoveries []rendezvous.Recovery `json:"recoveries"`
	// Stats is every live agent's rendezvous.PrefixStats value, by node id: raw,
	// for the reader that knows its format (package straggler).
	Stats map[string][]byte `json:"-"`
	// Goodput is every agent's rendezvous.PrefixGoodput value, by node id: raw, for
	// package goodput.
	Goodput map[string][]byte `json:"-"`
}

// ReadStatus reads the current incarnation of run runID without taking
// part in it (no lease, no writes). A finished job stays readable for
// RetentionTTL after it closed.
func (c *Conn) ReadStatus(ctx context.Context, runID string) (Status, error) {
	client := c.client
	in, started, err := c.ReadCurrent(ctx, runID)
	if err != nil || !started {
		return Status{RunID: runID}, err
	}
	// The keys status shows, not the rounds' own (thousands per round at
	// scale), in one read at one revision.
	var gets []clientv3.Op
	for _, key := range []string{rendezvous.KeyState, rendezvous.KeyRoster} {
		gets = append(gets, clientv3.OpGet(key))
	}
	for _, prefix := range []string{rendezvous.PrefixNodes, rendezvous.PrefixWait, rendezvous.PrefixFail, rendezvous.PrefixStats, rendezvous.PrefixKept, rendezvous.PrefixGoodput} {
		gets = append(gets, clientv3.OpGet(prefix, clientv3.WithPrefix()))
	}
	resp, err := incarnationKV(client, in).Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return Status{}, fmt.Errorf("rendezvous: read run %s (incarnation %d): %w", runID, in.Number, err)
	}
	var kvs []rendezvous.KV
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			kvs = append(kvs, rendezvous.KV{Key: string(kv.Key), Value: kv.Value, Rev: kv.ModRevision, Create: kv.CreateRevision})
		}
	}
	st := statusOf(kvs)
	st.RunID, st.Started, st.Incarnation, st.Generation = runID, true, in.Number, in.Generation
	return st, nil
}

// statusOf decodes the keys ReadStatus read (rendezvous.ParseKey and
// Decode); a key of another kind, or a value that does not decode, is
// left out.
func statusOf(kvs []rendezvous.KV) Status {
	st := Status{Roster: rendezvous.Roster{Round: -1}}
	var failures, kept []rendezvous.KV
	for _, kv := range kvs {
		k, ok := rendezvous.ParseKey(kv.Key)
		if !ok {
			continue
		}
		switch k.Kind {
		case rendezvous.KindFailure:
			failures = append(failures, kv)
			continue
		case rendezvous.KindKept:
			kept = append(kept, kv)
			continue
		}
		v, err := rendezvous.Decode(k, kv)
		switch k.Kind {
		case rendezvous.KindState:
			st.State, _ = v.(rendezvous.State)
			st.Exists = err == nil
		case rendezvous.KindRoster:
			st.Roster, _ = v.(rendezvous.Roster)
		case rendezvous.KindNode:
			if err == nil {
				st.Nodes = append(st.Nodes, v.(rendezvous.Member))
			}
		case rendezvous.KindWaiting:
			if err == nil {
				st.Waiting = append(st.Waiting, v.(rendezvous.Member))
			}
		case rendezvous.KindStats:
			if st.Stats == nil {
				st.Stats = map[string][]byte{}
			}
			st.Stats[k.ID] = kv.Value
		case rendezvous.KindGoodput:
			if st.Goodput == nil {
				st.Goodput = map[string][]byte{}
			}
			st.Goodput[k.ID] = kv.Value
		}
	}
	sort.Slice(st.Nodes, func(i, j int) bool { return st.Nodes[i].Host < st.Nodes[j].Host })
	st.Failures = rendezvous.DecodeFailures(failures)
	st.Recoveries = rendezvous.DecodeRecoveries(kept)
	return st
}
