package trainer

import (
	"fmt"

	"github.com/gorun/gorun/trainer/kernels"
)

// rollback is a copy of this rank's owned parameters and AdamW moments
// taken just before an optimizer update: the state after step Step. It
// lets a rank that applied the update of a step that not every rank
// finished offer the step before, which every rank holds.
//
// Why one step is enough. Let done(r) be the last step rank r completed
// (parameters gathered again, record written, AfterStep returned nil)
// and live(r) the step its owned state is at; done(r) <= live(r) <=
// done(r)+1, since a rank applies one update per step. A rank applies
// the update of step j only after the Stats all-gather of step j
// completed on it, and that needs every rank's contribution to it, which
// a rank sends only once it completed step j-1. So if any rank has
// live = j, every rank has done >= j-1. With m = min over ranks of done:
// no rank has applied update m+2 (else every done >= m+1), so every
// done and every live is m or m+1; ranks differ by at most one completed
// step. Each rank holds step m: its live state (live = m) or this copy
// (live = m+1, the copy taken before update m+1).
//
// Whether the copy holds such a step is the rank's phase (updated, see
// phase); the copy itself is only its data.
type rollback struct {
	step         int
	params, m, v []float32
}

// keep copies the owned state at step before its next update, on e's
// threads.
func (r *rollback) keep(e *kernels.Engine, step int, params, m, v []float32) {
	n := len(params)
	if cap(r.params) < n {
		r.params, r.m, r.v = make([]float32, n), make([]float32, n), make([]float32, n)
	}
	r.params, r.m, r.v = r.params[:n], r.m[:n], r.v[:n]
	e.ForChunks(n, bufferChunk, func(lo, hi int) {
		copy(r.params[lo:hi], params[lo:hi])
		copy(r.m[lo:hi], m[lo:hi])
		copy(r.v[lo:hi], v[lo:hi])
	})
	r.step = step
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
