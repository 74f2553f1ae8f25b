package hsdp

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/gorun/gorun/trainer/comm"
)

// Groups runs the collectives of one training step for a Plan: the shard
// group gathers parameters and reduce-scatters gradients, the replica
// group all-reduces each owned gradient slice, and the whole world sums
// the step's loss and gradient norm. Groups of one rank are skipped, so a
// single process runs without a comm.World. Calls must be made in the same
// order on every rank; a Groups is not safe for concurrent use.
type Groups struct {
	plan                  Plan
	shard, replica, world *comm.Group // nil when the group is this rank alone
}

// Join creates the shard and replica groups of p on w, in that order on
// every rank (each waits, up to w's timeout, for its ring neighbors to do
// the same). w may be nil when p has a world of one rank; otherwise its
// rank and size must be p's.
func Join(w *comm.World, p Plan) (*Groups, error) {
	g := &Groups{plan: p}
	if p.WorldSize() == 1 {
		return g, nil
	}
	if w == nil {
		return nil, fmt.Errorf("hsdp: join: a world of %d ranks needs a comm.World", p.WorldSize())
	}
	if w.Rank() != p.Rank || w.Size() != p.WorldSize() {
		return nil, fmt.Errorf("hsdp: join: plan is rank %d of %d, world is rank %d of %d",
			p.Rank, p.WorldSize(), w.Rank(), w.Size())
	}
	var err error
	if p.Shards > 1 {
		if g.shard, err = w.Group(p.ShardGroup()); err != nil {
			return nil, fmt.Errorf("hsdp: join shard group %v: %w", p.ShardGroup(), err)
		}
	}
	if p.Replicas > 1 {
		if g.replica, err = w.Group(p.ReplicaGroup()); err != nil {
			return nil, fmt.Errorf("hsdp: join replica group %v: %w", p.ReplicaGroup(), err)
		}
	}
	g.world = w.All()
	return g, nil
}

// SetTimeout bounds each send or receive of the step's collectives from
// now on (comm.Group.SetTimeout): d is what comm.TimeoutRule makes of the
// observed step time; 0 returns to the world's timeout.
func (g *Groups) SetTimeout(d time.Duration) {
	for _, c := range []*comm.Group{g.shard, g.replica, g.world} {
		if c != nil {
			c.SetTimeout(d)
		}
	}
}

// Plan is the plan the groups were joined for.
func (g *Groups) Plan() Plan { return g.plan }

// GatherPart fills part with elements [a, a+len(part)) of the padded flat
// buffer of n elements whose slices the shard group owns: owned is this
// rank's slice, Owned(n), and is current; on return every element of part
// is. It moves only the part: a trainer gathers one unit of the model at a
// time and reuses the memory for the next. part may be owned's own
// elements [a, a+len(part)) (a part within this rank's slice is read in
// place: this rank only sends), and must not overlap owned otherwise.
func (g *Groups) GatherPart(owned, part []float32, a, n int) error {
	lo, hi, err := g.checkPart("gather part", len(owned), a, a+len(part), n)
	if err != nil {
		return err
	}
	b := a + len(part)
	if c, d := max(a, lo), min(b, hi); c < d && &part[c-a] != &owned[c-lo] {
		copy(part[c-a:d-a], owned[c-lo:d-lo])
	}
	if g.shard == nil {
		return nil
	}
	if err := g.shard.AllGatherV(part, g.partBounds(a, b, n)); err != nil {
		return fmt.Errorf("hsdp: gather parameters [%d, %d): %w", a, b, err)
	}
	return nil
}

// ReducePart adds, to this rank's slice owned of a float64 gradient sum
// (Owned(n) of the padded flat buffer of n elements), the elements of the
// shard group's sum of grads, elements [a, a+len(grads)) of each rank's
// flat gradient, that fall in the slice. Each element gets the bits
// comm.Group.ReduceScatterWiden gives it in a reduce-scatter of the whole
// buffer, added to what owned held: a trainer reduces each unit's gradient
// as soon as the backward pass is done with it. The replica group is left
// to ReduceReplicas, once per step. grads is left as it was.
func (g *Groups) ReducePart(grads []float32, a, n int, owned []float64) error {
	lo, hi, err := g.checkPart("reduce part", len(owned), a, a+len(grads), n)
	if err != nil {
		return err
	}
	b := a + len(grads)
	mine := owned[min(max(a, lo), hi)-lo : max(min(b, hi), lo)-lo]
	if g.shard == nil {
		for i, x := range grads[max(a, lo)-a : max(min(b, hi), lo)-a] {
			mine[i] += 0 + float64(x)
		}
		return nil
	}
	if err := g.shard.ReduceScatterAddV(grads, g.partBounds(a, b, n), mine); err != nil {
		return fmt.Errorf("hsdp: reduce gradients [%d, %d) in shard group: %w", a, b, err)
	}
	return nil
}

// checkPart checks a part [a, b) of the padded flat buffer of n elements
// and this rank's slice of ownedLen elements, and returns the slice's
// bounds [lo, hi) in the buffer.
func (g *Groups) checkPart(op string, ownedLen, a, b, n int) (lo, hi int, err error) {
	lo, hi = g.plan.Owned(n)
	if ownedLen != hi-lo {
		return 0, 0, fmt.Errorf("hsdp: %s: owned slice of %d elements, want %d", op, ownedLen, hi-lo)
	}
	if a < 0 || b > n {
		return 0, 0, fmt.Errorf("hsdp: %s: [%d, %d) outside the buffer of %d", op, a, b, n)
	}
	return lo, hi, nil
}

// partBounds are the bounds of [a, b) split by the shard group's slices of
// a buffer of n elements: block k is [a, b)'s overlap with shard k's slice,
// offset from a.
func (g *Groups) partBounds(a, b, n int) []int {
	m := n / g.plan.Shards
	bounds := make([]int, g.plan.Shards+1)
	for k := range bounds {
		bounds[k] = min(max(k*m, a), b) - a
	}
	return bounds
}

// ReduceReplicas all-reduces this rank's slice of the step's gradient sum
// over the replica group, in float64 (nothing with one replica): after
// ReducePart of every unit, owned holds the world's sum.
func (g *Groups) ReduceReplicas(owned []float64) error {
	if g.replica != nil {
		if err := g.replica.AllReduce64(owned); err != nil {
			return fmt.Errorf("hsdp: reduce gradients in replica group: %w", err)
		}
	}
	return nil
}

// Stats combines the figures of one step over the world: the mean of
// every rank's loss, the sum of the shard group's gradient sums of
// squares (each slice counted once, not once per replica), which is the
// square of the global gradient norm, and whether any rank asks to stop
// (before this step's update: the same answer on every rank, so they all
// stop at the same step). The sums are added in float64 in rank order,
// so every rank gets the same bits.
func (g *Groups) Stats(loss, sumSquares float64, stop bool) (meanLoss, globalSumSquares float64, anyStop bool, err error) {
	if g.world == nil {
		return loss, sumSquares, stop, nil
	}
	var b [17]byte
	binary.LittleEndian.PutUint64(b[0:], math.Float64bits(loss))
	binary.LittleEndian.PutUint64(b[8:], math.Float64bits(sumSquares))
	if stop {
		b[16] = 1
	}
	all, err := g.world.AllGatherBytes(b[:])
	if err != nil {
		return 0, 0, false, fmt.Errorf("hsdp: step statistics: %w", err)
	}
	for r, d := range all {
		if len(d) != len(b) {
			return 0, 0, false, fmt.Errorf("hsdp: step statistics: rank %d sent %d bytes, want %d", r, len(d), len(b))
		}
		meanLoss += math.Float64frombits(binary.LittleEndian.Uint64(d[0:]))
		if r < g.plan.Shards { // replica 0's shard group: every slice once
			globalSumSquares += math.Float64frombits(binary.LittleEndian.Uint64(d[8:]))
		}
		anyStop = anyStop || d[16] != 0
	}
	return meanLoss / float64(len(all)), globalSumSquares, anyStop, nil
}
