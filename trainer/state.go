package trainer

import (
	"errors"
	"fmt"

	"github.com/gorun/gorun/trainer/recovery"
)

// State returns this rank's state between steps: its owned slice of the
// parameters and AdamW moments and the sample index of the next step. Its
// slices are the trainer's own buffers, valid until the next Run or
// Restore: copy them to keep them (an asynchronous save must).
func (t *Trainer) State() recovery.State {
	step := int64(t.state.Step)
	return recovery.State{Sample: t.batch.First(step), Slice: recovery.Slice{Step: step, Lo: t.lo, Hi: t.hi,
		Params: t.params, M: t.state.M, V: t.state.V}}
}

// Restore sets this rank's state from a copy s held elsewhere, resharded
// to this rank's slice (a checkpoint is read with RestoreInPlace, which
// needs no such copy). Every rank restores its own
// slice before Run, which gathers the full parameters first. It copies s,
// and changes nothing and returns an error when s does not fit: another
// slice, wrong lengths, a step past the run, or a sample index that does
// not start that step (a different global batch).
func (t *Trainer) Restore(s recovery.State) error {
	n := t.hi - t.lo
	switch {
	case s.Lo != t.lo || s.Hi != t.hi:
		return fmt.Errorf("trainer: restore: state holds [%d, %d), this rank owns [%d, %d)", s.Lo, s.Hi, t.lo, t.hi)
	case len(s.Params) != n || len(s.M) != n || len(s.V) != n:
		return fmt.Errorf("trainer: restore: %d params, %d m, %d v, want %d of each", len(s.Params), len(s.M), len(s.V), n)
	}
	if err := t.restorable(s.Step, s.Sample); err != nil {
		return err
	}
	if err := t.enter(event{kind: set, step: int(s.Step), round: t.cfg.Worker.RestartCount}); err != nil {
		return fmt.Errorf("trainer: restore: %w", err)
	}
	copy(t.params, s.Params)
	copy(t.state.M, s.M)
	copy(t.state.V, s.V)
	t.state.Step = int(s.Step)
	return nil
}

// RestoreInPlace is Restore without the copy, for a trainer that holds
// nothing yet (phase fresh: as New made it, or as an exchange that found
// no step covered left it): fill writes the state straight into the
// trainer's own buffers, this rank's slice at step 0 with the padding
// zero, and returns the step and sample index it wrote. A checkpoint read
// this way takes no memory beyond the trainer's: read into a state of its
// own it would take the size of the parameters and both moments of the
// slice again (12 bytes an element) at the start of a resumed run. When
// fill fails, its error is returned as it is (fill may have written part
// of the buffers); when its step and sample do not fit, Restore's error;
// either way the trainer is as New made it again. A trainer that holds a
// step is refused and left as it is.
func (t *Trainer) RestoreInPlace(fill func(dst recovery.Slice) (step, sample int64, err error)) error {
	if t.recovery.phase != fresh {
		return fmt.Errorf("trainer: restore in place: refused in phase %v (only a trainer that holds nothing is filled in place)", t.recovery.phase)
	}
	step, sample, err := fill(recovery.Slice{Lo: t.lo, Hi: t.hi, Params: t.params, M: t.state.M, V: t.state.V})
	if err == nil {
		err = t.restorable(step, sample)
	}
	if err == nil {
		err = t.enter(event{kind: set, step: int(step), round: t.cfg.Worker.RestartCount})
	}
	if err != nil {
		if rerr := t.reset(); rerr != nil {
			return errors.Join(err, rerr)
		}
		return err
	}
	t.state.Step = int(step)
	return nil
}

// restorable says why a state of step and sample index sample does not
// fit this run: a step past it, or a sample that does not start the step.
func (t *Trainer) restorable(step, sample int64) error {
	switch {
	case step < 0 || step > int64(t.cfg.Train.Train.Steps):
		return fmt.Errorf("trainer: restore: step %d outside 0 .. %d", step, t.cfg.Train.Train.Steps)
	case sample != t.batch.First(step):
		return fmt.Errorf("trainer: restore: sample index %d does not start step %d (want %d): global batch changed?",
			sample, step, t.batch.First(step))
	}
	return nil
}
