package data

import "fmt"

// Batch deals one optimizer step's global batch out to the ranks: the
// samples of step s are the global indices s·Global .. s·Global+Global-1;
// rank r owns the contiguous slice r·Global/World .. (r+1)·Global/World-1
// of them, consumed Micro at a time. The union over ranks is the same
// whatever the world size, so a resized run sees the same samples.
type Batch struct {
	Global int // sequences per optimizer step, whole job
	Micro  int // sequences per forward/backward on one rank
	World  int // ranks
}

// NewBatch checks that global splits into micro batches evenly over world
// ranks and returns the Batch.
func NewBatch(global, micro, world int) (Batch, error) {
	if global < 1 || micro < 1 || world < 1 {
		return Batch{}, fmt.Errorf("data: batch: global %d, micro %d, world %d: all must be at least 1", global, micro, world)
	}
	if global%(micro*world) != 0 {
		return Batch{}, fmt.Errorf("data: batch: global batch %d does not split into micro batches of %d over %d ranks", global, micro, world)
	}
	return Batch{Global: global, Micro: micro, World: world}, nil
}

// Accumulation is the number of micro steps per rank per optimizer step.
func (b Batch) Accumulation() int { return b.Global / (b.Micro * b.World) }

// First is the global index of the first sample of optimizer step step:
// the sample index a checkpoint taken before that step records.
func (b Batch) First(step int64) int64 { return step * int64(b.Global) }

// MicroFirst is the global index of the first of the Micro samples that
// rank runs in micro step micro (0 .. Accumulation-1) of optimizer step.
func (b Batch) MicroFirst(step int64, rank, micro int) int64 {
	return b.First(step) + int64(rank*(b.Global/b.World)+micro*b.Micro)
}
