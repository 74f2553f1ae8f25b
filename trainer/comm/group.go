package comm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Group is an ordered set of ranks that run collectives together over a
// ring: each member sends to the next member and receives from the
// previous one, on connections of their own. Collectives on one Group run
// one at a time (a second call waits); every member must call the same
// collectives in the same order with the same lengths. Results are
// deterministic: every member ends with bit-identical data. After any
// error the World is unusable (close it; the launcher restarts the round).
type Group struct {
	w                  *World
	ranks              []int
	me                 int // index of this rank in ranks
	next, prev         net.Conn
	nextRank, prevRank int
	tx, rx             *shmRing // shared memory of a same-node link, or nil
	// timeout bounds each send or receive of a collective, in
	// nanoseconds; 0: the world's timeout (SetTimeout).
	timeout atomic.Int64

	mu      sync.Mutex
	seq     uint32
	tmp     []byte    // one received chunk, before it is added
	wide    []float64 // one widened chunk, before it is sent (step.sendWide)
	scratch [2][]byte // reduce-scatter partial sums (8-byte aligned)
}

// SetTimeout bounds each send or receive of this group's collectives
// from now on (one already waiting keeps its bound): a peer that moves
// nothing for d fails the world, naming it. The trainer sets it from the
// observed step time (TimeoutRule). 0 or less returns to the world's
// timeout (Config.Timeout). Safe to call while a collective runs.
func (g *Group) SetTimeout(d time.Duration) { g.timeout.Store(int64(max(d, 0))) }

// ioTimeout is the bound of one send or receive (SetTimeout).
func (g *Group) ioTimeout() time.Duration {
	if d := time.Duration(g.timeout.Load()); d > 0 {
		return d
	}
	return g.w.timeout
}

// Size is the number of members.
func (g *Group) Size() int { return len(g.ranks) }

// Rank is this rank's index in the group (not its global rank).
func (g *Group) Rank() int { return g.me }

// Ranks returns the members' global ranks, in ring order.
func (g *Group) Ranks() []int { return append([]int(nil), g.ranks...) }

// Collective operations, as named in errors and headers.
const (
	opAllReduce uint32 = iota + 1
	opReduceScatter
	opAllGather
	opBroadcast
	opBarrier
	opAllReduce64
	opReduceScatter64
)

func opName(op uint32) string {
	switch op {
	case opAllReduce:
		return "allreduce"
	case opReduceScatter:
		return "reducescatter"
	case opAllGather:
		return "allgather"
	case opBroadcast:
		return "broadcast"
	case opBarrier:
		return "barrier"
	case opAllReduce64:
		return "allreduce64"
	case opReduceScatter64:
		return "reducescatter64"
	}
	return fmt.Sprintf("op%d", op)
}

// header opens every collective on every link, so members that disagree
// about the call get a clear error instead of garbage.
type header struct {
	op, seq uint32
	n       uint64 // elements (bytes for byte collectives)
	root    uint64
}

const headerLen = 24

func (h header) put(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], h.op)
	binary.LittleEndian.PutUint32(b[4:], h.seq)
	binary.LittleEndian.PutUint64(b[8:], h.n)
	binary.LittleEndian.PutUint64(b[16:], h.root)
}

func getHeader(b []byte) header {
	return header{
		op: binary.LittleEndian.Uint32(b[0:]), seq: binary.LittleEndian.Uint32(b[4:]),
		n: binary.LittleEndian.Uint64(b[8:]), root: binary.LittleEndian.Uint64(b[16:]),
	}
}

func (h header) String() string {
	s := fmt.Sprintf("%s of %d elements", opName(h.op), h.n)
	if h.op == opBroadcast {
		s += fmt.Sprintf(" from group rank %d", h.root)
	}
	return fmt.Sprintf("%s as collective #%d", s, h.seq)
}

// begin takes the group for one collective and checks the world is whole.
func (g *Group) begin(op string) error {
	g.mu.Lock()
	if err := g.w.broken(op); err != nil {
		g.mu.Unlock()
		return err
	}
	return nil
}

func (g *Group) end() { g.mu.Unlock() }

// block returns the [lo, hi) element bounds of block k of n elements split
// into size blocks: the first n%size blocks have one element more.
func block(n, size, k int) (lo, hi int) {
	base, rem := n/size, n%size
	lo = k*base + min(k, rem)
	hi = lo + base
	if k < rem {
		hi++
	}
	return lo, hi
}

func mod(a, n int) int { return ((a % n) + n) % n }

// AllReduce sums buf element-wise over the members, in place. The order
// of additions is fixed by the ring, so every member gets bit-identical
// sums. buf must have the same length on every member.
func (g *Group) AllReduce(buf []float32) error {
	return allReduce(g, "allreduce", opAllReduce, buf)
}

// AllReduce64 is AllReduce in float64 (twice the bytes on the wire): sums
// of float32 values made in it keep about 29 more bits, so the order of
// the additions almost never shows once they are rounded to float32.
func (g *Group) AllReduce64(buf []float64) error {
	return allReduce(g, "allreduce64", opAllReduce64, buf)
}

func allReduce[T float32 | float64](g *Group, op string, code uint32, buf []T) error {
	if err := g.begin(op); err != nil {
		return err
	}
	defer g.end()
	n, i := g.Size(), g.me
	if n == 1 {
		return nil
	}
	steps := make([]step, 0, 2*n-2)
	for s := 0; s < 2*n-2; s++ {
		slo, shi := block(len(buf), n, mod(i-s, n))
		rlo, rhi := block(len(buf), n, mod(i-s-1, n))
		st := step{send: bytesOf(buf[slo:shi]), sendAfter: s - 1, recvAfter: -1}
		if s < n-1 {
			st.sumDst, st.sum = bytesOf(buf[rlo:rhi]), summer(buf[rlo:rhi], buf[rlo:rhi])
		} else {
			st.recvInto = bytesOf(buf[rlo:rhi])
			if s+1-n >= 0 {
				st.recvAfter = s + 1 - n
			}
		}
		steps = append(steps, st)
	}
	return g.ring(op, header{op: code, n: uint64(len(buf))}, steps)
}

// ReduceScatter sums in element-wise over the members and leaves in out
// the Rank()-th of Size() equal blocks of the sum. len(in) must be
// Size()*len(out) on every member; in is not changed; in and out must not
// overlap.
func (g *Group) ReduceScatter(in, out []float32) error {
	return reduceScatter(g, "reducescatter", opReduceScatter, in, out)
}

// ReduceScatter64 is ReduceScatter in float64 (see AllReduce64).
func (g *Group) ReduceScatter64(in, out []float64) error {
	return reduceScatter(g, "reducescatter64", opReduceScatter64, in, out)
}

// ReduceScatterWiden is ReduceScatter64 of in widened to float64 (see
// Widen), without a float64 copy of in: each element is widened where
// the ring first uses it, so out gets the same bits as ReduceScatter64 of
// a float64 buffer that was zeroed and then had in added to it. What goes
// on the wire is the same too: members may mix the two calls.
func (g *Group) ReduceScatterWiden(in []float32, out []float64) error {
	return reduceScatter(g, "reducescatter64", opReduceScatter64, in, out)
}

// scratchBytes bounds each of a reduce-scatter's two scratch buffers
// (Group.scratch): the partial sums move through them one span of the
// blocks at a time (2 chunks), so they take the same memory whatever the
// length of the blocks.
const scratchBytes = 2 * chunkBytes

// reduceScatter sums S elements in Ts: S is T, or S is float32 and T
// float64 (the elements are widened). It runs the ring on spans of
// scratchBytes of Ts (see reduceScatterSpans), on blocks of equal length.
func reduceScatter[S, T float32 | float64](g *Group, op string, code uint32, in []S, out []T) error {
	if len(in) != g.Size()*len(out) {
		return fmt.Errorf("comm: %s: len(in) = %d, want group size %d x len(out) %d", op, len(in), g.Size(), len(out))
	}
	bounds := make([]int, g.Size()+1)
	for k := range bounds {
		bounds[k] = k * len(out)
	}
	return reduceScatterSpans(g, op, code, in, bounds, out, scratchBytes/sizeOf[T](), false)
}

// reduceScatterSpans sums in over the members and leaves in out block
// Rank() of the sum, block k being in[bounds[k]:bounds[k+1]] (blocks may
// differ in length, and be empty); with accumulate, it adds the block to
// out instead, each element as out + sum.
//
// It runs in spans of span elements of each block: the n-1 steps of the
// ring for elements [0, span) of every block, then those for [span,
// 2·span), and so on, all in one ring call, so a span's first chunks go
// out while the previous span's last ones arrive. Each element of block k
// is summed by the same additions in the same order whatever span and the
// other blocks' bounds are (a sum never mixes elements, and the ring
// starts block k's sum at member k+1 and ends it at member k), so the
// result has the same bits; only the scratch, two buffers of span Ts,
// depends on span. The step that receives into a scratch buffer waits,
// chunk by chunk, for the step that sent the buffer's previous content.
func reduceScatterSpans[S, T float32 | float64](g *Group, op string, code uint32, in []S, bounds []int, out []T, span int, accumulate bool) error {
	n, i := g.Size(), g.me
	if err := checkBounds(op, bounds, n, len(in)); err != nil {
		return err
	}
	if m := bounds[i+1] - bounds[i]; len(out) != m {
		return fmt.Errorf("comm: %s: len(out) = %d, want this member's block of %d", op, len(out), m)
	}
	if err := g.begin(op); err != nil {
		return err
	}
	defer g.end()
	if n == 1 {
		wide, isFloat32 := any(in).([]float32)
		switch {
		case accumulate:
			addInto(out, in)
		case isFloat32 && isWide(out):
			Widen(any(out).([]float64), wide)
		default:
			copy(out, any(in).([]T))
		}
		return nil
	}
	longest := 0
	for k := range n {
		longest = max(longest, bounds[k+1]-bounds[k])
	}
	span = max(1, min(span, longest))
	if n > 2 && longest > 0 { // with two members the one step adds into out
		size := span * sizeOf[T]()
		for k := range g.scratch {
			if cap(g.scratch[k]) < size {
				g.scratch[k] = bytesOf(make([]float64, (size+7)/8))
			}
			g.scratch[k] = g.scratch[k][:size]
		}
	}
	steps := make([]step, 0, (longest+span-1)/span*(n-1))
	fill := 1                // the scratch buffer the last step received into
	sentBy := [2]int{-1, -1} // the step that sent each scratch buffer's content
	for c0 := 0; c0 < longest; c0 += span {
		c1 := c0 + span
		blk := func(k int) []S {
			lo, hi := bounds[k], bounds[k+1]
			return in[min(lo+c0, hi):min(lo+c1, hi)]
		}
		for s := 0; s < n-1; s++ {
			t := len(steps)
			st := step{sendAfter: -1, recvAfter: -1}
			if s == 0 {
				first := blk(mod(i-1, n))
				if wide, ok := any(first).([]float32); ok && isWide(out) {
					st.sendWide = wide
				} else {
					st.send = bytesOf(first)
				}
			} else { // what step t-1 received
				st.send, st.sendAfter = bytesOf(floatsOf[T](g.scratch[fill])[:len(blk(mod(i-s-1, n)))]), t-1
				sentBy[fill] = t
			}
			own := blk(mod(i-s-2, n))
			if s < n-2 {
				fill = 1 - fill
				dst := floatsOf[T](g.scratch[fill])[:len(own)]
				st.recvAfter = sentBy[fill]
				st.sumDst, st.sum = bytesOf(dst), sumOf(dst, own)
			} else {
				dst := out[min(c0, len(out)):min(c1, len(out))]
				st.sumDst, st.sum = bytesOf(dst), sumOf(dst, own)
				if accumulate {
					st.sum = accumulator(dst, own)
				}
			}
			steps = append(steps, st)
		}
	}
	return g.ring(op, header{op: code, n: uint64(len(in))}, steps)
}

// checkBounds checks that bounds splits a buffer of length total into n
// blocks: n+1 offsets from 0 to total, none below the one before.
func checkBounds(op string, bounds []int, n, total int) error {
	if len(bounds) != n+1 || bounds[0] != 0 || bounds[n] != total {
		return fmt.Errorf("comm: %s: bounds %v do not split %d elements into %d blocks", op, bounds, total, n)
	}
	for k := range n {
		if bounds[k+1] < bounds[k] {
			return fmt.Errorf("comm: %s: bounds %v: block %d ends before it starts", op, bounds, k)
		}
	}
	return nil
}

// ReduceScatterAddV sums in over the members, widened to float64 as
// ReduceScatterWiden does, and adds block Rank() of the sum to out: block
// k is in[bounds[k]:bounds[k+1]], bounds being Size()+1 offsets from 0 to
// len(in), the same on every member; blocks may differ in length or be
// empty. Each element of the sum has the bits ReduceScatterWiden gives it
// in a buffer of equal blocks where it lies in the same block, and is
// added to out as out + sum: a trainer reduces the gradient of one part
// of its model at a time, into the slice of the whole that each member
// owns, with the bits of one reduce-scatter of the whole. len(out) must be
// this member's block's length; in is not changed.
func (g *Group) ReduceScatterAddV(in []float32, bounds []int, out []float64) error {
	return reduceScatterSpans(g, "reducescatter64", opReduceScatter64, in, bounds, out, scratchBytes/8, true)
}

// AllGatherV is AllGather of blocks of any length, in place: block k of
// out is out[bounds[k]:bounds[k+1]], bounds being Size()+1 offsets from 0
// to len(out), the same on every member. On entry this member's block
// holds its part; on return every block holds its member's.
func (g *Group) AllGatherV(out []float32, bounds []int) error {
	const op = "allgather"
	n, i := g.Size(), g.me
	if err := checkBounds(op, bounds, n, len(out)); err != nil {
		return err
	}
	if err := g.begin(op); err != nil {
		return err
	}
	defer g.end()
	if n == 1 {
		return nil
	}
	blk := func(k int) []byte { return bytesOf(out[bounds[k]:bounds[k+1]]) }
	steps := make([]step, 0, n-1)
	for s := 0; s < n-1; s++ {
		steps = append(steps, step{send: blk(mod(i-s, n)), sendAfter: s - 1, recvAfter: -1, recvInto: blk(mod(i-s-1, n))})
	}
	return g.ring(op, header{op: opAllGather, n: uint64(len(out))}, steps)
}

// isWide reports whether out holds float64s (a reduce-scatter of float32s
// into it widens them).
func isWide[T float32 | float64](out []T) bool {
	_, ok := any(out).([]float64)
	return ok
}

// sumOf is the step.sum that adds received Ts to src into dst: summer
// when S is T, wideSummer when S is float32 and T float64.
func sumOf[S, T float32 | float64](dst []T, src []S) func(off int, b []byte) {
	if d, ok := any(dst).([]float64); ok {
		if s, ok := any(src).([]float32); ok {
			return wideSummer(d, s)
		}
	}
	return summer(dst, any(src).([]T))
}

// AllGather concatenates every member's in, in group order, into out.
// len(out) must be Size()*len(in) on every member.
func (g *Group) AllGather(in, out []float32) error {
	const op = "allgather"
	if len(out) != g.Size()*len(in) {
		return fmt.Errorf("comm: %s: len(out) = %d, want group size %d x len(in) %d", op, len(out), g.Size(), len(in))
	}
	if err := g.begin(op); err != nil {
		return err
	}
	defer g.end()
	return g.allGather(op, opAllGather, bytesOf(in), bytesOf(out))
}

func (g *Group) allGather(op string, code uint32, in, out []byte) error {
	n, i, m := g.Size(), g.me, len(in)
	copy(out[i*m:(i+1)*m], in)
	if n == 1 {
		return nil
	}
	steps := make([]step, 0, n-1)
	for s := 0; s < n-1; s++ {
		sb, rb := mod(i-s, n), mod(i-s-1, n)
		st := step{send: out[sb*m : (sb+1)*m], sendAfter: s - 1, recvAfter: -1, recvInto: out[rb*m : (rb+1)*m]}
		if s == 0 {
			st.send = in
		}
		steps = append(steps, st)
	}
	return g.ring(op, header{op: code, n: uint64(len(out))}, steps)
}

// Broadcast copies root's buf (root is a group rank) into every member's
// buf. buf must have the same length on every member.
func (g *Group) Broadcast(buf []float32, root int) error {
	if err := g.begin("broadcast"); err != nil {
		return err
	}
	defer g.end()
	return g.broadcast("broadcast", bytesOf(buf), root)
}

func (g *Group) broadcast(op string, buf []byte, root int) error {
	n := g.Size()
	if root < 0 || root >= n {
		return fmt.Errorf("comm: %s: root %d outside group size %d", op, root, n)
	}
	if n == 1 {
		return nil
	}
	p := mod(g.me-root, n) // position on the chain that starts at root
	st := step{sendAfter: -1, recvAfter: -1}
	if p < n-1 {
		st.send = buf
	}
	if p > 0 {
		st.recvInto = buf
		if p < n-1 {
			st.sendAfter = 0 // forward each chunk once it arrived
		}
	}
	return g.ring(op, header{op: opBroadcast, n: uint64(len(buf)), root: uint64(root)}, []step{st})
}

// Barrier returns once every member has called it.
func (g *Group) Barrier() error {
	const op = "barrier"
	if err := g.begin(op); err != nil {
		return err
	}
	defer g.end()
	in := []byte{1}
	return g.allGather(op, opBarrier, in, make([]byte, g.Size()))
}

// BroadcastBytes returns root's data on every member (root is a group
// rank; other members' data is ignored and may be nil).
func (g *Group) BroadcastBytes(data []byte, root int) ([]byte, error) {
	const op = "broadcastbytes"
	if err := g.begin(op); err != nil {
		return nil, err
	}
	defer g.end()
	var size [8]byte
	if g.me == root {
		binary.LittleEndian.PutUint64(size[:], uint64(len(data)))
	}
	if err := g.broadcast(op, size[:], root); err != nil {
		return nil, err
	}
	// Every member, root included, refuses an oversized message alike.
	n := binary.LittleEndian.Uint64(size[:])
	if n > maxBytesMsg {
		return nil, fmt.Errorf("comm: %s: root sends %d bytes, more than %d", op, n, maxBytesMsg)
	}
	if g.me == root {
		return data, g.broadcast(op, data, root)
	}
	out := make([]byte, n)
	return out, g.broadcast(op, out, root)
}

// maxBytesMsg bounds one byte collective (checkpoint metadata, not tensors).
const maxBytesMsg = 1 << 30

// AllGatherBytes returns every member's data, indexed by group rank.
func (g *Group) AllGatherBytes(data []byte) ([][]byte, error) {
	const op = "allgatherbytes"
	if err := g.begin(op); err != nil {
		return nil, err
	}
	defer g.end()
	n := g.Size()
	var mine [8]byte
	binary.LittleEndian.PutUint64(mine[:], uint64(len(data)))
	sizes := make([]byte, 8*n)
	if err := g.allGather(op, opAllGather, mine[:], sizes); err != nil {
		return nil, err
	}
	longest := uint64(0)
	for k := range n {
		longest = max(longest, binary.LittleEndian.Uint64(sizes[8*k:]))
	}
	if longest > maxBytesMsg/uint64(n) {
		return nil, fmt.Errorf("comm: %s: a member sends %d bytes, more than %d", op, longest, maxBytesMsg/n)
	}
	in := make([]byte, longest)
	copy(in, data)
	all := make([]byte, int(longest)*n)
	if err := g.allGather(op, opAllGather, in, all); err != nil {
		return nil, err
	}
	out := make([][]byte, n)
	for k := range n {
		l := binary.LittleEndian.Uint64(sizes[8*k:])
		out[k] = all[k*int(longest) : k*int(longest)+int(l) : k*int(longest)+int(l)]
	}
	return out, nil
}

var errStopped = errors.New("stopped")
