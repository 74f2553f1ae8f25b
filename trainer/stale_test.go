package trainer

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/internal/worldtest"
	"github.com/gorun/gorun/trainer/metrics"
	"github.com/gorun/gorun/trainer/recovery"
)

// staleOutcome is what one process of TestStaleRejoinerDoesNotRollBack
// left behind.
type staleOutcome struct {
	cut   error    // rounds 0 to 1: the cut-off ranks' Run, the survivors' Reform
	rec   Recovery // from the Reform into round 2
	err   error
	state recovery.State // at the end
	steps []int          // the steps of the records AfterStep saw, every round
}

// TestStaleRejoinerDoesNotRollBack: HSDP 3 x 2 in round 0; after step 5
// the two ranks of replica 2 are cut off (their Run ends, their world
// closes; a partition whose lease expired). The four survivors re-form
// as 2 x 2 in round 1 and go on to step 12. Then the cut-off ranks come
// back in round 2 with the state they held, a whole replica at step 5,
// and all six re-form as 3 x 2. Capped at the lowest step any rank with
// live state completed, the exchange would pick step 5, which their
// replica covers, and redo steps 6 to 12; the rejoiners are from an older
// round, so their state counts as a fresh rank's: every rank goes on
// from step 12, nothing is redone, the rejoiners receive their whole
// slices, each step is trained once, and the end is bit for bit the
// fault-free 3 x 2 run's.
func TestStaleRejoinerDoesNotRollBack(t *testing.T) {
	cfg := reformConfig(t, config.ModeHSDP)
	n := modelSize(t, cfg)
	ds := datasetOf(t, cfg)
	rounds := worldtest.Rounds(t, "stale-test", worldtest.Shape{Size: 6, PerNode: 2},
		worldtest.Shape{Size: 4, PerNode: 2}, worldtest.Shape{Size: 6, PerNode: 2})
	dir := t.TempDir()
	const cutAt, rejoinAt = 5, 12
	out := make([]staleOutcome, 6)
	var round1 sync.WaitGroup // the survivors' round 1 Run returned
	round1.Add(4)
	testutil.OnRanks(6, func(r int) error {
		o := &out[r]
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		survivor := r < 4
		tr, err := New(ctx, Config{Train: cfg, Worker: rounds[0].Worker(r), Threads: 1, Dataset: ds,
			CommTimeout: 30 * time.Second, Metrics: filepath.Join(dir, "m{rank}.jsonl"),
			AfterStep: func(tr *Trainer, rec metrics.Record) error {
				o.steps = append(o.steps, rec.Step)
				switch {
				case !survivor && rec.Step == cutAt:
					cancel()
				case rec.WorldSize == 4 && rec.Step == rejoinAt:
					return errBoundary
				}
				return nil
			}})
		if err != nil {
			o.err = err
			if survivor {
				round1.Done()
			}
			return nil
		}
		defer tr.Close()
		_, o.cut = tr.Run(ctx)
		if survivor {
			if _, o.cut = tr.Reform(context.Background(), rounds[1].Worker(r), nil); o.cut == nil {
				_, o.cut = tr.Run(context.Background())
			}
			round1.Done()
		}
		round1.Wait()
		if o.rec, o.err = tr.Reform(context.Background(), rounds[2].Worker(r), nil); o.err != nil {
			return nil
		}
		_, o.err = tr.Run(context.Background())
		o.state = copyState(tr.State())
		return nil
	})

	all := func(from, to int) []int {
		var s []int
		for i := from; i <= to; i++ {
			s = append(s, i)
		}
		return s
	}
	for r, o := range out {
		require.NoError(t, o.err, "rank %d", r)
		require.Equal(t, recovery.Peers, o.rec.Source, "rank %d", r)
		require.EqualValues(t, rejoinAt, o.rec.Step, "rank %d: the running world's step, not the rejoiners'", r)
		require.Zero(t, o.rec.Redone, "rank %d", r)
		if r < 4 {
			require.ErrorIs(t, o.cut, errBoundary, "survivor %d ends round 1 at step %d", r, rejoinAt)
			require.Zero(t, o.rec.Received, "survivor %d keeps its slice", r)
			require.Equal(t, all(1, 20), o.steps, "survivor %d trains each step once", r)
			continue
		}
		require.ErrorIs(t, o.cut, context.Canceled, "rank %d is cut off", r)
		whole := 12 * int64(min(o.state.Hi, n)-o.state.Lo)
		require.Equal(t, whole, o.rec.Received, "rejoiner %d receives its whole slice (12 bytes an element)", r)
		require.Equal(t, append(all(1, cutAt), all(rejoinAt+1, 20)...), o.steps, "rejoiner %d", r)
	}
	for r := range out {
		recs, err := metrics.ReadFile(filepath.Join(dir, fmt.Sprintf("m%d.jsonl", r)))
		require.NoError(t, err)
		want := slices.Concat(steps(1, cutAt, 0), steps(cutAt+1, rejoinAt, 1), steps(rejoinAt+1, 20, 2))
		if r >= 4 {
			want = slices.Concat(steps(1, cutAt, 0), steps(rejoinAt+1, 20, 2))
		}
		require.Equal(t, want, roundsOf(recs), "rank %d: each step once, marked with the round that trained it", r)
	}
	want := faultFree(t, cfg, 6, 2)
	got := finalStates(out)
	for r := range want {
		require.Equal(t, want[r], got[r], fmt.Sprintf("rank %d: bit for bit the fault-free run", r))
	}
}

func finalStates(out []staleOutcome) []recovery.State {
	s := make([]recovery.State, len(out))
	for i, o := range out {
		s[i] = o.state
	}
	return s
}
