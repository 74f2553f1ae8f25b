package trainer

import (
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

// Restore sets this rank's state from s, typically read back from a
// checkpoint, resharded to this rank's slice. Every rank restores its own
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
	case s.Step < 0 || s.Step > int64(t.cfg.Train.Train.Steps):
		return fmt.Errorf("trainer: restore: step %d outside 0 .. %d", s.Step, t.cfg.Train.Train.Steps)
	case s.Sample != t.batch.First(s.Step):
		return fmt.Errorf("trainer: restore: sample index %d does not start step %d (want %d): global batch changed?",
			s.Sample, s.Step, t.batch.First(s.Step))
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
