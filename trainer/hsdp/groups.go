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

// GatherParams fills full from the owned slices of the shard group: on
// entry this rank's slice full[Owned(len(full))] is current, on return
// every element is. len(full) must be a multiple of Shards and the same on
// every rank.
func (g *Groups) GatherParams(full []float32) error {
	if g.shard == nil {
		return nil
	}
	lo, hi := g.plan.Owned(len(full))
	if err := g.shard.AllGather(full[lo:hi], full); err != nil {
		return fmt.Errorf("hsdp: gather parameters: %w", err)
	}
	return nil
}

// ReduceGrads sums the full gradient buffers of every rank and leaves this
// rank's slice of the sum in owned: a reduce-scatter in the shard group,
// then an all-reduce of the slice in the replica group, both in float64.
// Sums of float32 gradients made in float64 keep about 29 bits more than
// float32 does, so the order of the additions, which depends on the
// layout, almost never shows once they are rounded to float32: any
// layout gives the same bits. It does not scale. len(owned) must be
// len(full)/Shards; with one shard, owned may be full itself. full is
// left as it was, except that with one shard and owned == full the sum is
// made in place.
func (g *Groups) ReduceGrads(full, owned []float64) error {
	if len(owned)*g.plan.Shards != len(full) {
		return fmt.Errorf("hsdp: reduce gradients: owned slice of %d elements, want %d/%d", len(owned), len(full), g.plan.Shards)
	}
	if g.shard != nil {
		if err := g.shard.ReduceScatter64(full, owned); err != nil {
			return fmt.Errorf("hsdp: reduce gradients in shard group: %w", err)
		}
	} else if len(owned) > 0 && &owned[0] != &full[0] {
		copy(owned, full)
	}
	return g.reduceReplicas(owned)
}

// ReduceGrads32 is ReduceGrads of a float32 full buffer, for a step of one
// micro batch per rank: owned gets the same bits as ReduceGrads gives for
// a float64 buffer that was zeroed and then had full added to it, with no
// such buffer (comm.Group.ReduceScatterWiden). len(owned) must be
// len(full)/Shards; full is left as it was.
func (g *Groups) ReduceGrads32(full []float32, owned []float64) error {
	if len(owned)*g.plan.Shards != len(full) {
		return fmt.Errorf("hsdp: reduce gradients: owned slice of %d elements, want %d/%d", len(owned), len(full), g.plan.Shards)
	}
	if g.shard != nil {
		if err := g.shard.ReduceScatterWiden(full, owned); err != nil {
			return fmt.Errorf("hsdp: reduce gradients in shard group: %w", err)
		}
	} else {
		comm.Widen(owned, full)
	}
	return g.reduceReplicas(owned)
}

// reduceReplicas all-reduces this rank's owned slice of the gradient sum
// in the replica group.
func (g *Groups) reduceReplicas(owned []float64) error {
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
