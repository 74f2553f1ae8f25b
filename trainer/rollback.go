package trainer

import (
	"fmt"

	"unsafe"

	"github.com/gorun/gorun/trainer/hsdp"
	"github.com/gorun/gorun/trainer/kernels"
)

// rollback is a copy of this rank's owned parameters and AdamW moments
// taken during an optimizer update, as they were before it: the state
// after step Step. It lets a rank that applied the update of a step that
// not every rank finished offer the step before, which every rank holds.
//
// Why one step is enough. Let done(r) be the last step rank r completed
// (record written, AfterStep returned nil) and live(r) the step its owned
// state is at; done(r) <= live(r) <= done(r)+1, since a rank applies one
// update per step. A rank applies the update of step j only after the
// Stats all-gather of step j completed on it, and that needs every rank's
// contribution to it, which a rank sends only once it completed step j-1.
// So if any rank has live = j, every rank has done >= j-1. With m = min
// over ranks of done: no rank has applied update m+2 (else every done >=
// m+1), so every done and every live is m or m+1; ranks differ by at most
// one completed step. Each rank holds step m: its live state (live = m)
// or this copy (live = m+1, the copy taken before update m+1).
//
// When the copy is no longer needed, and why its memory can hold the
// step's gradient sum. recovery.Decide never picks a step above the
// lowest step a rank of the running world completed. Once a rank knows
// that every rank completed step m+1, no exchange can pick m, and its
// copy of m is dead weight until the next update. In a world of one
// replica (the shard group is the world) a rank knows it from the first
// shard-group collective of step m+2 that completes on it: every member
// sends its part only after completing step m+1. In the modes that
// gather whole parameters (zero1, zero2) that is the gather that starts
// each step (unitWeights.refresh); in those that gather units (fsdp,
// hsdp) the forward pass's gathers. Either completes before the backward
// pass reduces its first gradient. With one shard per replica (ddp) every
// rank holds the whole model, so any step a rank's live state is at is
// covered by that rank alone, and the copy is never the only holder of a
// step Decide can pick. So in both layouts the step's gradient sum
// (8 bytes an element) lives in the copy's memory (12 bytes an element):
// the first reduction of a step claims it (event reused), and the update
// writes the copy, chunk by chunk, over the gradient it has read
// (kernels.Engine.AdamWKeeping). With several replicas of several shards
// (hsdp across nodes) nothing proves the other replicas completed the
// step before the backward pass ends, so there the copy has memory of its
// own.
//
// Whether the copy holds a step is the rank's phase (updated, see
// phase); the copy itself is only its data.
type rollback struct {
	step         int
	params, m, v []float32
	// inGradSum: params, m and v lie in the memory of the step's gradient
	// sum (see sumAndRollback), and are never reallocated.
	inGradSum bool
}

// sharesGradSum reports whether a rank of plan keeps the step's gradient
// sum in its rollback copy's memory: with one replica or one shard per
// replica (see rollback).
func sharesGradSum(plan hsdp.Plan) bool { return plan.Replicas == 1 || plan.Shards == 1 }

// sumAndRollback makes the float64 gradient sum of an owned slice of n
// elements and a rollback whose copy has none yet: in one buffer of 12n
// bytes, the sum in its first 8n and the copy's params, m and v in its
// thirds, when shared; apart, the copy made at the first update, when
// not.
func sumAndRollback(n int, shared bool) ([]float64, rollback) {
	if !shared {
		return make([]float64, n), rollback{}
	}
	mem := make([]float64, (3*n+1)/2)
	f := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(mem))), 3*n)
	return mem[:n:n], rollback{params: f[:n:n], m: f[n : 2*n : 2*n], v: f[2*n:], inGradSum: true}
}

// buffers is where the copy of the next update goes, for an owned slice
// of n elements: its own buffers, made the first time (or when n grew),
// or the gradient sum's memory.
func (r *rollback) buffers(n int) kernels.Kept {
	if !r.inGradSum && cap(r.params) < n {
		r.params, r.m, r.v = make([]float32, n), make([]float32, n), make([]float32, n)
	}
	r.params, r.m, r.v = r.params[:n], r.m[:n], r.v[:n]
	return kernels.Kept{Params: r.params, M: r.m, V: r.v}
}

// hooks inject faults at fixed points of a step, on the ranks a test
// chooses, so that tests make ranks diverge deterministically. nil hooks
// do nothing.
type hooks struct {
	// beforeUpdate runs after the step's Stats, before this rank applies
	// the optimizer update; an error stops Run without the update.
	beforeUpdate func(step int) error
	// afterUpdate runs after the update, before the step's record; an
	// error stops Run with the update applied and the step not completed.
	afterUpdate func(step int) error
	// corrupt changes a payload this rank sends in an exchange, after its
	// checksum was taken.
	corrupt func(payload []byte)
	// messageElems, when positive, bounds a transfer message's elements
	// instead of recovery.MaxMessageElems.
	messageElems int
}

// before runs hook, if set, for step and wraps its error.
func (h hooks) before(hook func(int) error, step int) error {
	if hook == nil {
		return nil
	}
	if err := hook(step); err != nil {
		return fmt.Errorf("trainer: step %d: %w", step, err)
	}
	return nil
}
