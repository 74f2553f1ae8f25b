package trainer

import (
	"context"
	"fmt"
	"time"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/trainer/recovery"
)

// Reform moves this rank into the world w describes and recovers the
// state to go on from. Call it after Run returned an error with a
// *comm.PeerError in its chain (a peer died, stalled or left), Run's
// context's cause (the caller ended the round: the world was aborted),
// or an AfterStep error the caller chose to stop on, on every rank of the new
// world that comes from the old one; ranks new to the job call New with w
// and then Exchange instead.
//
// It closes the metrics file and leaves the old world (peers see a
// goodbye), connects to w's world as New does (same Secret, CommTimeout
// and CommLog; up to the comm timeout or until ctx ends), re-plans the
// layout and batch split for w's world size (an accumulation that does
// not fit is an error naming the sizes that work), and runs Exchange with
// extra. On success Run goes on after Recovery.Step, and reopens the
// metrics to append the records of the new round. On an error the state this
// rank held is kept: Reform again (a new round) or Close.
func (t *Trainer) Reform(ctx context.Context, w distenv.Worker, extra []recovery.Slice) (Recovery, error) {
	start := time.Now()
	geo, err := geometryFor(t.cfg.Train, w, t.model.Layout())
	if err != nil {
		return Recovery{}, fmt.Errorf("trainer: reform: %w", err)
	}
	if err := t.closeMetrics(); err != nil {
		return Recovery{}, fmt.Errorf("trainer: reform: %w", err)
	}
	if err := t.enter(event{kind: reformed, own: t.own()}); err != nil {
		return Recovery{}, fmt.Errorf("trainer: reform: %w", err)
	}
	_ = t.closeWorld() // Close never fails
	t.world, t.groups = nil, nil
	world, groups, err := connectWorld(ctx, t.cfg, w, geo.plan)
	if err != nil {
		return Recovery{}, fmt.Errorf("trainer: reform: %w", err)
	}
	t.cfg.Worker, t.world, t.groups = w, world, groups
	t.setGeometry(geo)
	rec, err := t.exchange(ctx, extra)
	rec.Took = time.Since(start)
	if err != nil {
		return rec, fmt.Errorf("trainer: reform: %w", err)
	}
	return rec, nil
}
