package rendezvous

import "context"

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

// Store is what the protocol needs from etcd, for one job and one agent:
// keys are relative to the job's prefix, and leased keys live as long as
// this agent's session. Every method gives up when ctx ends, with its
// error.
type Store interface {
	// List returns every key under prefix and the store's revision.
	List(ctx context.Context, prefix string) ([]KV, int64, error)
	// CompareAndSwap sets key to value if its revision is still rev (0:
	// the key must not exist) and reports whether it did.
	CompareAndSwap(ctx context.Context, key string, rev int64, value []byte) (bool, error)
	// Put sets key; a leased key is deleted when the session ends.
	Put(ctx context.Context, key string, value []byte, leased bool) error
	// Delete removes key; a missing key is no error.
	Delete(ctx context.Context, key string) error
	// Watch sends every change under prefix after revision rev, in
	// order, until ctx ends; then, or when the watch breaks (compaction,
	// a lost connection), it closes the channel. The caller lists again
	// and watches again from there.
	Watch(ctx context.Context, prefix string, rev int64) <-chan Event
	// Done is closed when the session's lease is lost: its leased keys
	// are gone and the others see this agent as dead.
	Done() <-chan struct{}
	// Retain attaches the job's unleased keys (state, failure reports) to
	// a lease of RetentionTTL: called once the job closed, so a finished
	// job stays readable for a while and then goes.
	Retain(ctx context.Context) error
	// Close ends the session, releasing the lease (its leased keys are
	// deleted at once).
	Close() error
}
