package rendezvous

import (
	"context"
	"strings"
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

// MaxTxnWrites is the most writes one Store.Txn takes: etcd's default
// limit of operations per transaction (--max-txn-ops).
const MaxTxnWrites = 128

// IsPrefix says whether a List or Watch argument names a prefix rather
// than one key (see Store).
func IsPrefix(keyOrPrefix string) bool {
	return keyOrPrefix == "" || strings.HasSuffix(keyOrPrefix, "/")
}

// Store is what the protocol needs from etcd, for one job and one agent:
// keys are relative to the job's prefix, and leased keys live as long as
// this agent's session. Every method gives up when ctx ends, with its
// error.
//
// List and Watch take a key or a prefix: "" and names ending in '/' are
// prefixes (every key under them), any other name is one key exactly, so
// that an agent can follow its own keys without the others'.
//
// A session outlives an outage: when the lease is lost the store keeps
// trying to reach etcd, then keeps the old lease if etcd still holds it,
// or grants a new one and puts every leased key it holds (put and not
// deleted) again, with the value last put. Calls made in the meantime
// are retried until etcd answers or the store's patience runs out.
type Store interface {
	// List returns the key, or the keys under the prefix in key order
	// (the first limit of them; 0: all), and the store's revision.
	List(ctx context.Context, keyOrPrefix string, limit int) ([]KV, int64, error)
	// Txn puts every write (unleased), all or none, if key guard's
	// revision is still rev (0: it must not exist), and reports whether
	// it did; with guard "" it always does. At most MaxTxnWrites writes.
	Txn(ctx context.Context, guard string, rev int64, writes ...KV) (bool, error)
	// Claim creates key with value under this agent's lease if no key of
	// that name exists, and reports whether it did. Unlike Put's keys, a
	// claimed key is not put again when the session is re-established
	// under a new lease: whoever claims it then holds it.
	Claim(ctx context.Context, key string, value []byte) (bool, error)
	// Put sets key; a leased key lives as long as the session and is put
	// again when the session is re-established under a new lease.
	Put(ctx context.Context, key string, value []byte, leased bool) error
	// Delete removes key; a missing key is no error.
	Delete(ctx context.Context, key string) error
	// Watch sends every change of the key, or under the prefix, after
	// revision rev, in order, until ctx ends; then, or when the watch breaks (compaction,
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
