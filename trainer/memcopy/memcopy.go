package memcopy

import (
	"errors"
	"fmt"
	"hash/crc32"
	"sync"

	"github.com/gorun/gorun/trainer/comm"
	"github.com/gorun/gorun/trainer/recovery"
)

// check refuses a Slice that Validate refuses or that is longer than
// maxElems.
func check(c recovery.Slice) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if c.Len() > maxElems {
		return fmt.Errorf("elements [%d, %d): more than %d", c.Lo, c.Hi, maxElems)
	}
	return nil
}

// maxElems bounds one copy (three float32 arrays of it: 24 GiB), so that a
// damaged header cannot make a rank allocate without limit.
const maxElems = 1 << 31

// ErrRejected marks an exchange in which some rank received a copy that
// failed its crc32c check or was of another step. Every rank sees the
// same verdict and drops that step's copies alike; the Keeper goes on.
var ErrRejected = errors.New("memcopy: a copy was rejected")

// ErrClosed is returned by Snapshot after Close.
var ErrClosed = errors.New("memcopy: keeper closed")

// Keeper keeps this rank's memory copies: its own snapshot of its shard
// and, with r replicas, the copies of the shards of the r ranks at the same
// local rank on the r previous nodes, rank - j*localWorldSize (mod world)
// for j = 1..r. Its snapshots go to the r next nodes' ranks.
//
// Each snapshot is one exchange over a ring of the ranks with this local
// rank, one per node in node order: a header and the data move one step
// around the ring (comm.Group.Shift), r times, each rank passing on what
// it received the time before, and each rank checks the crc32c of what it
// received; then every rank of the world learns every rank's verdict (an
// all-gather over a group of all ranks of the Keeper's own). Invariant: a
// rank keeps a step as committed only when every rank of the world
// reported verified copies of that step; so when any rank committed step
// s, every rank holds a complete, verified set of step s, committed or
// pending (see Copies), and the state of every shard at step s survives
// the loss of any r nodes. The own snapshot is kept with the held copies
// of its step, never alone.
//
// Memory: two generations of one own snapshot and r held copies each (the
// committed one and the one in flight): 2(1+r) shard-sized buffers of
// three arrays.
//
// Snapshot, Wait and Close are called by one goroutine (the training
// loop); Copies is safe at any time from any goroutine.
type Keeper struct {
	g           *comm.Group // the ring of this local rank; nil: a world of one node, own snapshots only
	all         *comm.Group // every rank, for the verdicts
	rank        int
	perNode     int
	replicas    int // copies of each shard on other nodes (0 in a world of one node)
	buddy, from int // global ranks: where snapshots go, where the first held copy comes from; -1: none
	table       *crc32.Table

	mu        sync.Mutex
	gens      [2]generation
	committed int           // index into gens, -1: none
	pending   int           // index into gens, -1: none
	running   chan struct{} // closed when the exchange in flight ends; nil: none started
	last      error         // of the latest exchange
	broken    bool          // the group failed: no exchange any more
	closed    bool
	lastStep  int64

	// tamper, when set (tests only), damages the bytes this rank received
	// before it checks them.
	tamper func(received []byte)
}

// generation is one own snapshot and the copies held for the same step:
// held[j] is the shard of the rank j+1 nodes back.
type generation struct {
	own      recovery.Slice
	held     []recovery.Slice
	ownBuf   []float32   // params | m | v
	heldBufs [][]float32 // params | m | v, per held copy
}

// New makes rank w.Rank()'s Keeper, keeping each shard on `replicas`
// other nodes (at most the number of other nodes; fewer are kept when the
// world has fewer): a collective, every rank of w calls it at the same
// point with the same replicas (after the trainer made its groups, if
// both make groups on w). Ranks must be numbered node by node,
// localWorldSize per node (node = rank / localWorldSize), as the launcher
// numbers them. It makes two groups on w, the ranks of this local rank in
// node order, then every rank, and waits for their ring neighbours within
// w's timeout. In a world of one node there is no other node to hold a
// copy: the Keeper then keeps only its own snapshots (Copies returns no
// held copy) and sends nothing.
func New(w *comm.World, localWorldSize, replicas int) (*Keeper, error) {
	size, rank := w.Size(), w.Rank()
	if localWorldSize < 1 || size%localWorldSize != 0 {
		return nil, fmt.Errorf("memcopy: new: local world size %d does not divide world size %d", localWorldSize, size)
	}
	if replicas < 1 {
		return nil, fmt.Errorf("memcopy: new: %d replicas, want 1 or more", replicas)
	}
	k := &Keeper{rank: rank, perNode: localWorldSize, buddy: -1, from: -1, committed: -1, pending: -1,
		table: crc32.MakeTable(crc32.Castagnoli), lastStep: -1}
	nodes := size / localWorldSize
	if nodes == 1 {
		return k, nil
	}
	k.replicas = min(replicas, nodes-1)
	ring := make([]int, nodes)
	for node := range ring {
		ring[node] = node*localWorldSize + rank%localWorldSize
	}
	g, err := w.Group(ring)
	if err != nil {
		return nil, fmt.Errorf("memcopy: new: group %v: %w", ring, err)
	}
	all := make([]int, size)
	for r := range all {
		all[r] = r
	}
	if k.all, err = w.Group(all); err != nil {
		return nil, fmt.Errorf("memcopy: new: group of all ranks: %w", err)
	}
	k.g = g
	k.buddy = (rank + localWorldSize) % size
	k.from = (rank - localWorldSize + size) % size
	return k, nil
}

// Buddy is the global rank this rank's snapshots go to first (the next
// node's), -1 in a world of one node.
func (k *Keeper) Buddy() int { return k.buddy }

// From is the global rank whose copy this rank holds first (the previous
// node's), -1 in a world of one node.
func (k *Keeper) From() int { return k.from }

// Replicas is how many other nodes hold each shard (0 in a world of one
// node).
func (k *Keeper) Replicas() int { return k.replicas }

// Snapshot takes c, the state of this rank's shard after a completed step,
// into a buffer of the Keeper's (c may change once it returns) and starts
// sending it to the buddy rank in the background; it returns without
// waiting for the transfer. Every rank of the world must snapshot the same
// steps, in increasing order. If the previous exchange is still running,
// Snapshot first waits for it (within the World's timeout: a collective
// that makes no progress fails). If that exchange failed, Snapshot returns
// its error and starts nothing: after a group failure (a *comm.PeerError
// in the chain: the World is broken) for good; after a rejected copy
// (ErrRejected, which every rank returns alike) once, and the next
// Snapshot goes on. Bad input is an error that starts nothing.
func (k *Keeper) Snapshot(c recovery.Slice) error {
	if err := check(c); err != nil {
		return fmt.Errorf("memcopy: snapshot of step %d: %w", c.Step, err)
	}
	k.waitRunning()
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case k.closed:
		return ErrClosed
	case k.last != nil:
		err := k.last
		if !k.broken {
			k.last = nil
		}
		return err
	case c.Step <= k.lastStep:
		return fmt.Errorf("memcopy: snapshot of step %d: not after step %d, the last snapshot", c.Step, k.lastStep)
	}
	k.lastStep = c.Step
	i := 0
	if k.committed == 0 {
		i = 1
	}
	gen := &k.gens[i]
	gen.fill(c)
	if k.g == nil {
		k.committed = i
		return nil
	}
	done := make(chan struct{})
	k.running = done
	go func() {
		defer close(done)
		err := k.exchange(i)
		k.mu.Lock()
		k.last = err
		k.mu.Unlock()
	}()
	return nil
}

// waitRunning waits for the exchange in flight, if any.
func (k *Keeper) waitRunning() {
	k.mu.Lock()
	running := k.running
	k.mu.Unlock()
	if running != nil {
		<-running
	}
}

// Wait waits for the exchange in flight, if any, and returns the error of
// the latest exchange: nil, an error wrapping ErrRejected, or the group's
// failure (a *comm.PeerError, or comm.ErrClosed, in its chain). It ends
// when the exchange does: at once when the World fails or is closed, else
// within the World's timeout of the last progress.
func (k *Keeper) Wait() error {
	k.waitRunning()
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.last
}

// Copies returns the complete, verified copies this rank holds, newest
// step first, each step as a set: this rank's own snapshot, then the
// copies of the shards of the Replicas() previous nodes' ranks, nearest
// first (none in a world of one node). It
// returns at most two steps: the newest step whose exchange every rank
// confirmed (committed) and, when a failure cut the confirmation short,
// the newer step this rank itself received and verified (pending: whether
// every rank has it is for the caller's exchange to find out). By the
// invariant on Keeper, some step is held by every surviving rank. A copy
// whose transfer did not complete or whose checksum failed is never
// returned. Copies stay valid after the World broke and after Close; their
// slices alias the Keeper's buffers until the next Snapshot (which reuses
// the older generation), so take them when no Snapshot follows, or copy
// them.
func (k *Keeper) Copies() []recovery.Slice {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []recovery.Slice
	for _, i := range []int{k.pending, k.committed} {
		if i < 0 {
			continue
		}
		out = append(out, k.gens[i].own)
		out = append(out, k.gens[i].held...)
	}
	return out
}

// Close waits for the exchange in flight (to abandon it, close or break
// the World first: it then ends at once) and makes later Snapshots fail
// with ErrClosed; Copies stays valid. The group's connections belong to
// the World and go with it. Close returns nil; closing twice is harmless.
func (k *Keeper) Close() error {
	k.waitRunning()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.closed = true
	return nil
}

// fill copies c into the generation's own buffer and forgets its held
// copies.
func (gen *generation) fill(c recovery.Slice) {
	n := c.Hi - c.Lo
	gen.ownBuf = grow(gen.ownBuf, 3*n)
	gen.own = split(c.Step, c.Lo, c.Hi, gen.ownBuf)
	gen.own.CopyFrom(c)
	gen.held = gen.held[:0]
}

// split views buf (3 x (hi-lo) long) as the params, m and v of a Slice.
func split(step int64, lo, hi int, buf []float32) recovery.Slice {
	n := hi - lo
	return recovery.Slice{Step: step, Lo: lo, Hi: hi, Params: buf[:n:n], M: buf[n : 2*n : 2*n], V: buf[2*n : 3*n : 3*n]}
}

// grow returns buf resliced to n, or a new slice when it is too small.
func grow(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n)
	}
	return buf[:n]
}
