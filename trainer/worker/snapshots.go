package worker

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"github.com/gorun/gorun/internal/snapshot"
	"github.com/gorun/gorun/trainer"
	"github.com/gorun/gorun/trainer/recovery"
)

// snapshotDir is the directory the agent keeps the workers' per-step
// state in (snapshot.EnvDir), "" when unset: a worker started without
// gorun, or with --snapshots=false, saves and offers nothing. Set, it
// must name a directory.
func snapshotDir(lookup func(string) (string, bool)) (string, error) {
	dir, ok := lookup(snapshot.EnvDir)
	if !ok || dir == "" {
		return "", nil
	}
	st, err := os.Stat(dir)
	if err == nil && !st.IsDir() {
		err = errors.New("not a directory")
	}
	if err != nil {
		return "", fmt.Errorf("%s=%s: %w (gorun makes it for each job; unset it to run without snapshots)", snapshot.EnvDir, dir, err)
	}
	return dir, nil
}

// rankSlots is where one rank of the embedded trainer saves its state
// after every step: its two slots in the agent's snapshot directory
// (snapshot.RankSlots), each holding the rank's owned slice of the
// parameters and AdamW moments in the trainer's own payload
// (recovery.Slice.Saved), the step in the slot's header. A worker killed
// at any point leaves the slot of the last step it saved, or of the one
// before, whole: the process that restarts its rank offers them
// (takeOver), and the world goes on without a checkpoint.
//
// The save is synchronous, at the start of AfterStep. A peer completes
// step s+1 only once this rank sent its statistics of step s+1, which it
// does only after its save of step s returned. So a rank killed between
// steps (its save of s done, nothing of s+1 sent) leaves s whole, and no
// peer completed a step past s: the world goes on from s with nothing
// redone (the other slot holds s-1, for a peer still behind). Killed in
// step s+1, after its statistics went out, it costs at most that step:
// the peers hold s in their rollback copies. A save in the background, or
// one skipped while another is in flight, could lag further behind than
// the peers' copies reach, and the world would go back to a checkpoint.
type rankSlots struct {
	slots *snapshot.RankSlots
	rank  int
}

// openSlots opens rank's slots in dir.
func openSlots(dir string, rank int) (*rankSlots, error) {
	s, err := snapshot.OpenRank(dir, rank)
	if err != nil {
		return nil, fmt.Errorf("worker rank %d: snapshots: %w", rank, err)
	}
	return &rankSlots{slots: s, rank: rank}, nil
}

// save writes t's state after the step it completed into the slot that
// does not hold the newer one. A state the same on every rank (one shard:
// every rank holds the whole model) is flagged replicated.
func (r *rankSlots) save(t *trainer.Trainer) error {
	st := t.State()
	h := snapshot.Header{Step: uint64(st.Step), Length: uint64(recovery.SavedLen(st.Len())), World: t.Plan().WorldSize()}
	if t.Plan().Shards == 1 {
		h.Flags = snapshot.FlagReplicated
	}
	if err := r.slots.Write(h, st.Slice.Saved(t.SavedRun())); err != nil {
		return fmt.Errorf("worker rank %d: snapshot of step %d (%d bytes): %w", r.rank, st.Step, h.Length, err)
	}
	return nil
}

// close closes the slot files (the agent removes them with the directory).
func (r *rankSlots) close() error {
	if r == nil {
		return nil
	}
	return r.slots.Close()
}

// takeOver reads what rank saved in dir (each complete slot of run's, at
// most step steps, that parses) for a fresh worker to offer as its own
// (Trainer.HoldSaved). A slot that is missing, empty or torn is none; one
// that is corrupt, of another run or past its steps is none either, and
// is said on warn. It returns the slices, the newest first.
func takeOver(dir string, rank int, run recovery.Run, steps int, warn io.Writer) ([]recovery.Slice, error) {
	var held []recovery.Slice
	for _, path := range snapshot.Paths(dir, rank) {
		s, err := readSaved(path, run)
		switch {
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, snapshot.ErrIncomplete):
			continue
		case errors.Is(err, snapshot.ErrCorrupt) || errors.Is(err, recovery.ErrBadSaved) || errors.Is(err, recovery.ErrOtherRun):
			fmt.Fprintf(warn, "worker rank %d: not offering %s: %v\n", rank, path, err)
			continue
		case err != nil:
			return nil, fmt.Errorf("worker rank %d: read its saved state: %w", rank, err)
		case s.Step > int64(steps):
			fmt.Fprintf(warn, "worker rank %d: not offering %s: step %d, past this run's %d steps\n", rank, path, s.Step, steps)
			continue
		}
		if len(held) > 0 && s.Step > held[0].Step {
			s, held[0] = held[0], s
		}
		held = append(held, s)
	}
	return held, nil
}

// readSaved verifies the slot file at path and parses its payload.
func readSaved(path string, run recovery.Run) (recovery.Slice, error) {
	slot, err := snapshot.Verify(path)
	if err != nil {
		return recovery.Slice{}, err
	}
	payload, err := snapshot.ReadPayload(slot)
	if err != nil {
		return recovery.Slice{}, err
	}
	s, err := recovery.ParseSaved(slot.Step, payload, run)
	if err != nil {
		return recovery.Slice{}, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// describeSaved names the steps of held for a log line: "steps 284 and 283".
func describeSaved(held []recovery.Slice) string {
	steps := make([]string, len(held))
	for i, s := range held {
		steps[i] = fmt.Sprint(s.Step)
	}
	if len(steps) == 1 {
		return "step " + steps[0]
	}
	return "steps " + strings.Join(steps, " and ")
}
