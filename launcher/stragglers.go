package launcher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/internal/straggler"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/liveness"
	"github.com/gorun/gorun/rendezvous/status"
)

// statsEvery is how often an agent publishes its ranks' median step
// compute and looks for stragglers among every node's.
const statsEvery = 2 * time.Second

// trackingObserver feeds the workers' step compute times to a
// straggler.Tracker and passes everything on to next (when not nil).
type trackingObserver struct {
	next    elastic.Observer
	tracker *straggler.Tracker
	snaps   *snapshotStatus // nil: snapshots are off
}

// observeStragglers makes spec's observer also feed tracker, and snaps
// when not nil.
func observeStragglers(spec *elastic.Spec, tracker *straggler.Tracker, snaps *snapshotStatus) {
	spec.Observer = trackingObserver{next: spec.Observer, tracker: tracker, snaps: snaps}
}

// SnapshotsAgreed records the agreement for gorun status and passes it on
// to next when it takes it (elastic.SnapshotObserver).
func (o trackingObserver) SnapshotsAgreed(r rendezvous.Round, rec elastic.SnapshotRecovery) {
	o.snaps.agreed(r, rec)
	if s, ok := o.next.(elastic.SnapshotObserver); ok {
		s.SnapshotsAgreed(r, rec)
	}
}

// SnapshotReplicated records the copy for gorun status and passes it on
// to next when it takes it (elastic.SnapshotObserver).
func (o trackingObserver) SnapshotReplicated(rank int, step uint64, peer string) {
	o.snaps.replicated(rank, step, peer)
	if s, ok := o.next.(elastic.SnapshotObserver); ok {
		s.SnapshotReplicated(rank, step, peer)
	}
}

func (o trackingObserver) StateChanged(from, to elastic.State) {
	if o.next != nil {
		o.next.StateChanged(from, to)
	}
}

func (o trackingObserver) RoundStarted(r rendezvous.Round, formed time.Duration) {
	o.snaps.roundStarted()
	if o.next != nil {
		o.next.RoundStarted(r, formed)
	}
}

func (o trackingObserver) Restarted(cause elastic.RestartCause, nodesLost int) {
	if o.next != nil {
		o.next.Restarted(cause, nodesLost)
	}
}

func (o trackingObserver) RecoveredInPlace(r rendezvous.Round, nodesLost int) {
	if o.next != nil {
		o.next.RecoveredInPlace(r, nodesLost)
	}
}

// RoundEnded passes the round's end on to next when it takes it
// (elastic.EndObserver).
func (o trackingObserver) RoundEnded(end rendezvous.End) {
	if e, ok := o.next.(elastic.EndObserver); ok {
		e.RoundEnded(end)
	}
}

func (o trackingObserver) WorkerStarted(w distenv.Worker) {
	o.tracker.Started(w.LocalRank, w.Rank)
	o.snaps.workerStarted(w.Rank)
	if o.next != nil {
		o.next.WorkerStarted(w)
	}
}

func (o trackingObserver) WorkerProgress(w distenv.Worker, p heartbeat.Progress) {
	o.tracker.Observe(w.LocalRank, w.Rank, p)
	if o.next != nil {
		o.next.WorkerProgress(w, p)
	}
}

func (o trackingObserver) WorkerExited(w distenv.Worker, exitCode int) {
	if o.next != nil {
		o.next.WorkerExited(w, exitCode)
	}
}

// publishStats puts this node's straggler.Report under its leased stats
// key every statsEvery until ctx ends, and logs once each of its ranks
// that becomes (or stops being) a straggler of the whole job. A failed
// write or read is logged and tried again at the next tick.
//
// With an eviction policy (ev.after > 0), a node whose rank stays the
// job's straggler for ev.after evicts itself (ev.evict): the job goes on
// without it, and a spare takes its place.
func publishStats(ctx context.Context, store rendezvous.Store, nodeID, host string, tracker *straggler.Tracker, snaps *snapshotStatus, ev eviction, log zerolog.Logger) {
	tick := time.NewTicker(statsEvery)
	defer tick.Stop()
	slow := map[int]bool{} // this node's ranks named last time
	clock := liveness.EvictionClock{After: ev.after}
	for {
		var now time.Time
		select {
		case <-ctx.Done():
			return
		case now = <-tick.C:
		}
		own := tracker.Report(host)
		published := snaps.status()
		if len(own.Ranks) == 0 && published == nil {
			continue
		}
		value, err := status.WithSnapshots(own.Encode(), published)
		if err != nil {
			log.Warn().Err(err).Msg("publishing this node's snapshots") // a bug: Encode makes an object
			value = own.Encode()
		}
		if err := store.Put(ctx, rendezvous.StatsKey(nodeID), value, true); err != nil {
			if ctx.Err() == nil {
				log.Warn().Err(err).Msg("publishing this node's step compute")
			}
			continue
		}
		kvs, _, err := store.List(ctx, rendezvous.PrefixStats, 0)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn().Err(err).Msg("reading the job's step compute")
			}
			continue
		}
		found := straggler.Find(decodeReports(kvs))
		slow = logStragglers(log, own, found, slow)
		if ev.after <= 0 {
			continue
		}
		worst, straggling := ownStraggler(own, found)
		if !clock.Observe(now, straggling) {
			continue
		}
		why := fmt.Sprintf("its rank %d was the job's straggler for %s (%.1fx the median step compute; --evict-stragglers=%s)", worst.Rank, now.Sub(clock.Since).Round(time.Second), worst.Ratio, ev.after)
		switch err := ev.evict(ctx, why); {
		case errors.Is(err, rendezvous.ErrEvictTooFew):
			log.Warn().Str("why", why).Msg("not evicting this node: the job would have fewer nodes than its minimum")
			clock.Since = now // say so once per period, not every tick
		case err != nil:
			if ctx.Err() == nil {
				log.Warn().Err(err).Msg("evicting this node")
			}
		default:
			log.Warn().Str("why", why).Msg("evicted this node from the job")
		}
	}
}

// eviction is what publishStats does with a node that stays the job's
// straggler: after (0: never), evict.
type eviction struct {
	after time.Duration
	evict func(ctx context.Context, why string) error
}

// ownStraggler is the slowest of this node's ranks among the job's
// stragglers found, if any.
func ownStraggler(own straggler.Report, found []straggler.Straggler) (straggler.Straggler, bool) {
	mine := map[int]bool{}
	for _, rc := range own.Ranks {
		mine[rc.Rank] = true
	}
	var worst straggler.Straggler
	ok := false
	for _, s := range found {
		if mine[s.Rank] && (!ok || s.Ratio > worst.Ratio) {
			worst, ok = s, true
		}
	}
	return worst, ok
}

// logStragglers logs this node's ranks among found that were not named
// before, and those named before that no longer are; it returns the
// ranks named now.
func logStragglers(log zerolog.Logger, own straggler.Report, found []straggler.Straggler, before map[int]bool) map[int]bool {
	mine := map[int]bool{}
	for _, rc := range own.Ranks {
		mine[rc.Rank] = true
	}
	now := map[int]bool{}
	for _, s := range found {
		if !mine[s.Rank] {
			continue
		}
		now[s.Rank] = true
		if !before[s.Rank] {
			log.Warn().Int("rank", s.Rank).Float64("ratio", s.Ratio).Msg("straggler: " + s.String())
		}
	}
	for rank := range before {
		if !now[rank] {
			log.Info().Int("rank", rank).Msg("rank no longer a straggler")
		}
	}
	return now
}

// decodeReports decodes every stats key's Report, skipping any that do
// not decode (a newer agent's, or a torn write).
func decodeReports(kvs []rendezvous.KV) []straggler.Report {
	var out []straggler.Report
	for _, kv := range kvs {
		if !strings.HasPrefix(kv.Key, rendezvous.PrefixStats) {
			continue
		}
		if r, err := straggler.ParseReport(kv.Value); err == nil {
			out = append(out, r)
		}
	}
	return out
}
