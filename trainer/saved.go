package trainer

import (
	"fmt"

	"github.com/gorun/gorun/trainer/recovery"
)

// SavedRun names this run for its saved slices (recovery.Saved,
// recovery.ParseSaved): the hash of the train.toml fields that change the
// math and the model's element count. A slice saved under another name
// is of another run and cannot be offered.
func (t *Trainer) SavedRun() recovery.Run {
	return recovery.Run{Config: t.cfg.Train.Hash(), Size: t.model.Layout().Size}
}

// HoldSaved makes saved, the state this rank's previous process saved
// outside itself (its snapshot slots: slices of any range and step of
// this run, see SavedRun), what the rank offers the next Exchange (or
// Reform) as its own. So a worker restarted alone, which holds nothing
// live, offers the step its peers go on from, and the world need not go
// back to a checkpoint. It announces no completed step: the saved steps
// neither cap the step Exchange chooses nor count in Recovery.Redone (see
// recovery.Decide), which the peers' live state alone decides.
//
// Only a Trainer that holds nothing (as New made it) takes them; the
// Trainer keeps saved, not a copy, until the Exchange settles. On an
// error (a Trainer that holds something, a slice that is not well formed)
// nothing changes.
func (t *Trainer) HoldSaved(saved []recovery.Slice) error {
	for i, s := range saved {
		if err := s.Validate(); err != nil {
			return fmt.Errorf("trainer: hold saved state: slice %d: %w", i, err)
		}
	}
	if err := t.enter(event{kind: loaded, own: saved}); err != nil {
		return fmt.Errorf("trainer: hold saved state: %w (only a trainer that holds nothing takes it)", err)
	}
	return nil
}
