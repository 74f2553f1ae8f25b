package rendezvous

import (
	"context"
	"time"
)

// KV is one key as the store holds it.
type KV struct {
	Key    string
	Value  []byte
	Rev    int64 // the revision of its last change (etcd's ModRevision)
	Create int64 // the revision that created it (etcd's CreateRevision)
}

// Event is one change under a watched prefix.
type Event struct {
	KV
	Deleted bool
}

// Session is one agent's standing with its store at one moment.
type Session struct {
	// Live is false while the agent's lease is lost: keep-alives went
	// unanswered for the lease TTL, or etcd said the lease is gone. The
	// store re-establishes it in the background.
	Live bool
	// Since is when Live last changed (this host's clock; use it only
	// for durations): the start of the outage, or the re-establishment.
	Since time.Time
	// Outages counts how many times the session was lost.
	Outages int
	// Renewed says the last re-establishment found the old lease expired:
	// a new lease was granted and every leased key put again under it.
	Renewed bool
}

// Store is what the protocol needs from etcd, for one job and one agent:
// keys are relative to the job's prefix, and leased keys live as long as
// this agent's session. Every method gives up when ctx ends, with its
// error.
//
// A session outlives an outage: when the lease is lost the store keeps
// trying to reach etcd, then keeps the old lease if etcd still holds it,
// or grants a new one and puts every leased key it holds (put and not
// deleted) again, with the value last put. Calls made in the meantime
// are retried until etcd answers or the store's patience runs out.
type Store interface {
	// List returns every key under prefix and the store's revision.
	List(ctx context.Context, prefix string) ([]KV, int64, error)
	// CompareAndSwap sets key to value if its revision is still rev (0:
	// the key must not exist) and reports whether it did.
	CompareAndSwap(ctx context.Context, key string, rev int64, value []byte) (bool, error)
	// Put sets key; a leased key lives as long as the session and is put
	// again when the session is re-established under a new lease.
	Put(ctx context.Context, key string, value []byte, leased bool) error
	// Delete removes key; a missing key is no error.
	Delete(ctx context.Context, key string) error
	// Watch sends every change under prefix after revision rev, in
	// order, until ctx ends; then, or when the watch breaks (compaction,
	// a lost connection), it closes the channel. The caller lists again
	// and watches again from there.
	Watch(ctx context.Context, prefix string, rev int64) <-chan Event
	// Session returns the session as it is now and a channel closed at
	// its next change.
	Session() (Session, <-chan struct{})
	// CheckSession asks etcd whether this agent's lease still lives and
	// reports whether it does. When etcd says it does not, or does not
	// answer in time, the session counts as lost from then on and is
	// re-established in the background.
	CheckSession(ctx context.Context) bool
	// Retain attaches the job's unleased keys (state, failure reports) to
	// a lease of a retention TTL (etcdstore.RetentionTTL): called once the
	// job closed, so a finished job stays readable for a while and then
	// goes.
	Retain(ctx context.Context) error
	// Close ends the session, releasing the lease (its leased keys are
	// deleted at once).
	Close() error
}
