package trainer

import (
	"context"
	"io"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/recovery"
)

// slots keeps what a rank saved after its last two steps, as the worker's
// two snapshot slots do, through the payload's bytes (recovery.Saved and
// ParseSaved).
type slots struct {
	mu    sync.Mutex
	saved [][]byte
	steps []uint64
	run   recovery.Run
}

// save keeps tr's state after the step it completed, dropping the oldest
// of three.
func (s *slots) save(t *testing.T, tr *Trainer) {
	st := tr.State()
	b, err := io.ReadAll(st.Slice.Saved(tr.SavedRun()))
	require.NoError(t, err)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.run = tr.SavedRun()
	s.saved, s.steps = append(s.saved, b), append(s.steps, uint64(st.Step))
	if len(s.saved) > 2 {
		s.saved, s.steps = s.saved[1:], s.steps[1:]
	}
}

// read parses the slots kept, the newest first, leaving out the newest
// when tornNewest (a save cut short).
func (s *slots) read(t *testing.T, tornNewest bool) []recovery.Slice {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []recovery.Slice
	for i := len(s.saved) - 1; i >= 0; i-- {
		if tornNewest && i == len(s.saved)-1 {
			continue
		}
		sl, err := recovery.ParseSaved(s.steps[i], s.saved[i], s.run)
		require.NoError(t, err)
		out = append(out, sl)
	}
	return out
}

// TestRestartedRankTakesOverItsSavedState is issue 33's item 6 in
// process: one node of 2 ranks (fsdp, and hsdp with one replica), so the
// shard of rank 1 lives in rank 1 alone. Rank 1 saves its state after
// every step (two slots) and its process goes; a fresh rank 1 holds what
// it saved and exchanges with the survivor, which re-forms in place. The
// world goes on from the newest step both hold, with nothing received
// (each has its own shard) and no checkpoint: none redone when rank 1
// went between steps, the step in flight when it went after its update
// of step 11 and its peer completed that step, and one more when its
// newest save was cut short. The end is bit for bit the fault-free run.
func TestRestartedRankTakesOverItsSavedState(t *testing.T) {
	tests := []struct {
		name       string
		vanish     func(sl *slots) (setup func(old int, tr *Trainer), afterStep func(old, step int, cancel context.CancelFunc) error)
		tornNewest bool
		step       int64
		redone     int
	}{
		{"between steps (after step 10)", betweenSteps, false, 10, 0},
		{"in step 11, after its update; rank 0 completed step 11", inStep11, false, 10, 1},
		{"between steps, its save of step 10 cut short", betweenSteps, true, 9, 1},
	}
	for _, mode := range []string{config.ModeFSDP, config.ModeHSDP} {
		cfg := reformConfig(t, mode)
		n := modelSize(t, cfg)
		want := faultFree(t, cfg, 2, 2)
		for _, tc := range tests {
			t.Run(mode+"/"+tc.name, func(t *testing.T) {
				sl := &slots{}
				setup, afterStep := tc.vanish(sl)
				sc := scenario{cfg: cfg, first: 2, firstPerNode: 2, second: 2, secondPerNode: 2,
					procs: []process{{0, 0}, {1, -1}, {-1, 1}}, setup: setup, afterStep: afterStep,
					onStep: func(old int, tr *Trainer) {
						if old == 1 {
							sl.save(t, tr)
						}
					},
					hold: func(int) []recovery.Slice { return sl.read(t, tc.tornNewest) }}
				out := play(t, sc)
				requirePeerError(t, out[0].firstErr, "rank 0")
				for _, i := range []int{0, 2} {
					require.NoError(t, out[i].err, "process %d", i)
					require.Equal(t, Recovery{Source: recovery.Peers, Step: tc.step, Redone: tc.redone}, withoutTook(out[i].rec), "process %d", i)
				}
				require.True(t, sameBits(t, statesOf(out), want, n), "bit for bit the fault-free run")
			})
		}
	}
}

// betweenSteps: rank 1's process goes once it completed step 10.
func betweenSteps(*slots) (func(int, *Trainer), func(int, int, context.CancelFunc) error) {
	return nil, func(old, step int, cancel context.CancelFunc) error {
		if old == 1 && step == 10 {
			cancel()
		}
		return nil
	}
}

// inStep11: rank 1's process goes after its update of step 11, before
// completing it (so it saved step 10 last); rank 0 completes step 11.
func inStep11(*slots) (func(int, *Trainer), func(int, int, context.CancelFunc) error) {
	return func(old int, tr *Trainer) {
		if old == 1 {
			tr.hooks.afterUpdate = failAt(11)
		}
	}, nil
}
