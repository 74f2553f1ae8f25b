package elastic

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/internal/workerlog"
	"github.com/gorun/gorun/rendezvous"
)

// blameTimeout bounds the report of a culprit before the agent acts on
// it: the rendezvous must not keep a hung worker alive.
const blameTimeout = 5 * time.Second

// runRound runs this node's part of round r: with workers, kept from the
// round before (recovering says from where: nil for a hot spare's) and
// already told r's contracts, or, when workers is nil, with fresh workers
// it starts. It watches them until they all succeeded, one failed (then
// the others are stopped, or it alone is restarted: respawn), the round
// ended elsewhere (then they are stopped, or kept for the next round:
// reform; see Spec.InPlace), or ctx ended (a stop signal: then all are
// stopped with it). Workers it does not keep are released when it
// returns. It fails when the workers could not be started (then no
// outcome), or when it met an agent state edge that is not allowed (a
// bug; the outcome is then still how the round ended).
func (a *Agent) runRound(ctx context.Context, r rendezvous.Round, workers []*worker, recovering *keep) (outcome, error) {
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var warmDue <-chan time.Time
	var firstStep <-chan struct{}
	if workers == nil {
		snaps, err := a.prepareSnapshots(ctx, r)
		if err != nil {
			return a.snapshotOutcome(ctx, r, err), nil
		}
		if a.spec.Warm != nil {
			warmDue, firstStep = time.After(a.spec.WarmDelay), a.firstSnapshot(watchCtx, r.FirstRank)
		}
		if workers, err = a.startRound(r, snaps.env); err != nil {
			return nil, err
		}
		defer a.replicate(watchCtx, r, snaps)()
	}
	m := &roundMonitor{
		a: a, ctx: ctx, watchCtx: watchCtx, round: r, workers: workers, running: len(workers),
		stalled: make(chan stallOf, len(workers)), verdict: make(chan bool, 1),
		roundEnd: a.rdzv.Watch(watchCtx, r), recovering: recovering, warmDue: warmDue, firstStep: firstStep,
	}
	m.watchWorkers()
	out := m.run()
	stopWatch()
	m.probes.Wait()
	if keptBy(out) == nil {
		a.release(workers)
	}
	return out, m.badEdge
}

// keptBy is the workers that out keeps in place, or nil.
func keptBy(out outcome) *keep {
	switch o := out.(type) {
	case respawn:
		return o.keep
	case reform:
		return o.keep
	case rejoin:
		return o.keep
	}
	return nil
}

// startRound starts fresh workers for round r, with extra variables over
// their environment; when not all of them start, it stops and releases
// those that did.
func (a *Agent) startRound(r rendezvous.Round, extra []string) ([]*worker, error) {
	sink, err := a.sinkOf(r)
	if err != nil {
		return nil, err
	}
	workers, err := a.startWorkers(sink, r, extra)
	if err != nil {
		a.stopAll(workers, syscall.SIGTERM)
		a.release(workers)
		return nil, err
	}
	return workers, nil
}

// sinkOf returns the sink of round r's worker output: its attempt's log
// files and console prefixes.
func (a *Agent) sinkOf(r rendezvous.Round) (*workerlog.Sink, error) {
	cfg := a.spec.Logs
	cfg.Host, cfg.RunID, cfg.Attempt = a.spec.Host, a.spec.RunID, r.Number
	return workerlog.New(cfg)
}

// roundMonitor follows one round's workers on this node: one method per
// event, run from one goroutine.
type roundMonitor struct {
	a        *Agent
	ctx      context.Context // the job's: ends at a stop signal
	watchCtx context.Context // ends with the round
	round    rendezvous.Round
	workers  []*worker
	running  int // workers not yet reaped

	stalled  chan stallOf          // a worker whose heartbeats stopped
	verdict  chan bool             // the rendezvous's answer to a stall with no culprit here
	roundEnd <-chan rendezvous.End // the round ended elsewhere
	requeue  <-chan time.Time      // set once a worker stopped to be requeued
	judging  bool                  // a hang is being judged: later stalls are the same hang
	// awaitOver is set while a worker awaits a new round: when it fires,
	// the workers still awaiting count as failed.
	awaitOver <-chan time.Time
	// reformDue is set while a worker awaits a new round and the agent
	// may ask for one itself (Spec.ReformAfter).
	reformDue <-chan time.Time
	// recovering, in a round whose workers were kept in place, is where
	// they came from, until their first progress in this round.
	recovering *keep
	// warmDue and firstStep (this node's first snapshot in the round),
	// whichever comes first, start the next round's warm workers
	// (Spec.Warm).
	warmDue   <-chan time.Time
	firstStep <-chan struct{}
	probes    sync.WaitGroup // Unreachable checks of silent peers, bound to watchCtx
	badEdge   error          // the first state edge refused (a bug): runRound returns it
}

// stallOf is the stall of the worker at index i: its heartbeats stopped.
type stallOf struct {
	i     int
	stall heartbeat.Stall
}

// move moves the agent to state to (Agent.transition); an edge refused
// is kept for runRound to return, and the round's workers are handled as
// they would be after it.
func (m *roundMonitor) move(to State, fields ...any) {
	if err := m.a.transition(to, fields...); err != nil && m.badEdge == nil {
		m.badEdge = err
	}
}

// silence is a worker's report of a peer rank it heard nothing from.
type silence struct {
	w    *worker
	peer int
}

// watchWorkers turns each worker's heartbeat stall into an event (the
// agent follows their ends: Agent.exits), and starts the await bound for
// kept workers that still await their new world.
func (m *roundMonitor) watchWorkers() {
	for i, w := range m.workers {
		if w.heartbeat == nil {
			continue
		}
		if _, ok := w.heartbeat.Awaiting(); ok && m.awaitOver == nil {
			m.awaitOver = time.After(m.a.spec.AwaitTimeout)
		}
		go func() {
			if stall, ok := <-w.heartbeat.Watch(m.watchCtx, m.a.spec.HeartbeatTimeout); ok {
				w.health.markFrom(hung, healthy, resuming)
				m.stalled <- stallOf{i, stall}
			}
		}()
	}
}

// run handles events until the round is over for this node.
func (m *roundMonitor) run() outcome {
	for m.running > 0 {
		var done outcome
		select {
		case w := <-m.a.exits:
			if i := slices.Index(m.workers, w); i >= 0 {
				done = m.onExit(i)
			}
		case w := <-m.a.awaits:
			m.onAwait(w)
		case s := <-m.a.silent:
			m.onSilent(s)
		case <-m.awaitOver:
			done = m.onAwaitOver()
		case <-m.reformDue:
			m.onReformDue()
		case r := <-m.a.resumed:
			m.onResumed(r)
		case <-m.requeue:
			done = m.onRequeueGraceOver()
		case end, ok := <-m.roundEnd:
			done = m.onRoundEnd(end, ok)
		case s := <-m.stalled:
			m.onStall(s)
		case blame := <-m.verdict:
			m.onVerdict(blame)
		case s := <-m.a.passOn:
			m.onPassOn(s)
		case <-m.warmDue:
			m.onWarmDue()
		case <-m.firstStep:
			m.onWarmDue()
		case <-m.ctx.Done():
			done = m.onStop()
		}
		if done != nil {
			return done
		}
	}
	if m.requeue != nil {
		return requeue{}
	}
	return succeeded{}
}

// onExit: a worker ended. Success or a requeue exit lets the others go
// on; a failure stops them and ends the round.
func (m *roundMonitor) onExit(i int) outcome {
	m.running--
	w := m.workers[i]
	res := w.process.Result()
	if res.Success() {
		m.a.log.Info().Int("rank", w.contract.Rank).Msg("worker succeeded")
		return nil
	}
	if m.requeue != nil || m.stoppedForRequeue(w) {
		// The workers agreed on a checkpoint and stop one by one; the rest
		// get TermTimeout to follow.
		if m.requeue == nil {
			m.a.log.Warn().Int("rank", w.contract.Rank).Msg("worker checkpointed on request and stopped: requeue")
			m.requeue = time.After(m.a.spec.TermTimeout)
		}
		return nil
	}
	if m.respawnable(i) {
		return m.respawn(i)
	}
	m.move(StateStopping, "reason", "worker failed", "rank", w.contract.Rank, "result", res.String())
	failures := m.stopAll(syscall.SIGTERM)
	writeFailureTable(m.a.spec.Report, failures, len(m.workers)-len(failures))
	return failed{failures}
}

// goOn says whether the workers here other than the one at index except
// (-1: none) go on into the next round in place: in-place recovery is on,
// no worker is being stopped for a requeue nor was passed a requeue
// signal (a failure or a round end while the job stops is no change to
// recover from: SIGUSR1/SIGUSR2 make the workers checkpoint to stop),
// and each of them still runs, with a channel to be told its new
// contract, is not hung, and did not say it stops to be requeued.
func (m *roundMonitor) goOn(except int) bool {
	others := len(m.workers)
	if except >= 0 {
		others--
	}
	if !m.a.spec.InPlace || m.requeue != nil || m.a.signalled.Load() || m.running != others {
		return false
	}
	for j, w := range m.workers {
		if j != except && (w.heartbeat == nil || w.endedOnItsOwn() || w.health.load().stalled() || w.heartbeat.Requeued()) {
			return false
		}
	}
	return true
}

// respawnable says whether worker i, which failed, is restarted alone
// while every other worker of the job goes on in place: it is the only
// worker here that ended, and the others go on (goOn).
func (m *roundMonitor) respawnable(i int) bool { return m.goOn(i) }

// respawn: worker i failed and is restarted alone in the next round; the
// others are kept. Its failure is reported to the rendezvous by the
// agent (FailedInPlace), which opens that round.
func (m *roundMonitor) respawn(i int) outcome {
	w := m.workers[i]
	m.move(StateReforming, "reason", "worker failed: restarting it alone", "rank", w.contract.Rank, "result", w.process.Result().String())
	failure := m.a.failure(w, m.round, 0)
	fmt.Fprintf(m.a.spec.Report, "gorun: %s: restarting rank %d alone, the other workers go on in place\n", failure, w.contract.Rank)
	m.a.release([]*worker{w})
	k := &keep{kind: keepRespawn, workers: slices.Delete(slices.Clone(m.workers), i, i+1), replace: []int{i}, endedAt: time.Now(), lastStep: -1}
	for _, o := range k.workers {
		k.lastStep = max(k.lastStep, o.heartbeat.LastStep())
	}
	if res := w.process.Result(); !res.Ended.IsZero() {
		k.endedAt = res.Ended
	}
	return respawn{failure: failure, keep: k}
}

// onRequeueGraceOver: workers still run TermTimeout after one stopped to
// be requeued.
func (m *roundMonitor) onRequeueGraceOver() outcome {
	m.move(StateStopping, "reason", "requeue: workers still running after the grace period")
	m.stopAll(syscall.SIGTERM)
	return requeue{}
}

// onRoundEnd: the round ended elsewhere (or ok is false: the watch ended
// with ctx, handled by onStop). The workers stop; any that had already
// failed on their own are still reported, after the failures that ended
// the round.
func (m *roundMonitor) onRoundEnd(end rendezvous.End, ok bool) outcome {
	if !ok {
		m.roundEnd = nil
		return nil
	}
	if m.keepable(end) {
		cause := "membership"
		if end.Cause == rendezvous.CauseFailure {
			cause = "a worker restarted alone"
		}
		m.move(StateReforming, "reason", end.Reason, "cause", cause)
		k := &keep{kind: keepMembership, workers: m.workers, end: end, endedAt: time.Now(), lastStep: -1}
		for _, w := range m.workers {
			k.lastStep = max(k.lastStep, w.heartbeat.LastStep())
			// A worker that saw its world break awaited since then: the
			// recovery is timed from the failure, not from the lease's expiry.
			if aw, ok := w.heartbeat.Awaiting(); ok && aw.At.Before(k.endedAt) {
				k.endedAt = aw.At
			}
		}
		return reform{end: end, keep: k}
	}
	m.move(StateStopping, "reason", end.Reason)
	failures := m.stopAll(syscall.SIGTERM)
	if m.requeue != nil || m.anyRequeued() {
		// The workers were stopping to be requeued (SLURM's --signal) when
		// the round ended: most likely a node whose workers stopped first
		// left. The job is to be requeued, not re-formed without it.
		return requeue{}
	}
	if len(failures) > 0 {
		writeFailureTable(m.a.spec.Report, failures, len(m.workers)-len(failures))
		m.blame(failures)
	}
	return ended{end}
}

// anyRequeued says whether a worker of the round that ended stopped for
// a requeue (stoppedForRequeue), on its own or while stopAll stopped it:
// a worker still writing its checkpoint when the round ended (a node
// whose workers stopped first left) finishes it and exits so.
func (m *roundMonitor) anyRequeued() bool {
	return slices.ContainsFunc(m.workers, func(w *worker) bool {
		return !w.process.Result().Ended.IsZero() && m.stoppedForRequeue(w)
	})
}

// stoppedForRequeue says whether worker w, which ended, checkpointed on
// request and stopped for the job to be requeued: it said so on its
// channel before it ended (whatever ended it then: the agent's own
// SIGTERM when the round ended meanwhile), or it exited ExitRequeue after
// gorun passed it a requeue signal. The first covers a node whose workers
// heard of the requeue from their peers (the ranks agree on the stop)
// before SLURM's signal reached this node's gorun, or without it. It
// first handles what is left on w's channel (Pipe.Drain), so that the
// last line w wrote is never overtaken by the exit it announces.
func (m *roundMonitor) stoppedForRequeue(w *worker) bool {
	if w.heartbeat != nil {
		w.heartbeat.Drain()
		if w.heartbeat.Requeued() {
			return true
		}
	}
	res := w.process.Result()
	return res.Signal == 0 && res.ExitCode == ExitRequeue && m.a.signalled.Load()
}

// keepable says whether the workers go on into the next round in place:
// the round ended for a membership change only, every worker here goes on
// (goOn), and no hang is being judged. Workers that were passed a requeue
// signal are checkpointing to stop: a round that ends meanwhile (a node
// whose workers stopped first left) is the job stopping, not a
// membership change to re-form for.
func (m *roundMonitor) keepable(end rendezvous.End) bool {
	return keptAcross(end) && !m.judging && m.goOn(-1)
}

// onAwait: worker w says its world broke and it awaits a new round. The
// round change is the rendezvous's (the lease decides who is gone); the
// agent only bounds the wait (Spec.AwaitTimeout).
func (m *roundMonitor) onAwait(w *worker) {
	if slices.Index(m.workers, w) < 0 {
		return
	}
	aw, ok := w.heartbeat.Awaiting()
	if !ok {
		return // it went on already
	}
	m.a.log.Info().Int("rank", w.contract.Rank).Int("step", aw.Step).Int("lost_peer", aw.LostPeer).Msg("worker awaits a new round")
	m.checkPeer(w, aw.LostPeer, "its world broke on it")
	if m.awaitOver == nil {
		m.awaitOver = time.After(m.a.spec.AwaitTimeout)
	}
	if m.reformDue == nil && m.a.spec.InPlace && m.a.spec.ReformAfter > 0 {
		m.reformDue = time.After(m.a.spec.ReformAfter << min(m.a.reforms.Load(), maxReformBackOff))
	}
}

// onSilent: a worker heard nothing from peer rank s.peer for
// heartbeat.SilentAfter while its world runs. A peer on another node is
// checked (Rendezvous.Unreachable: a probe of its node, reported when it
// fails) in the background, bound to the round; a peer on this node is a
// process, not a network, and the heartbeat timeout judges it.
func (m *roundMonitor) onSilent(s silence) {
	if slices.Index(m.workers, s.w) < 0 {
		return
	}
	m.checkPeer(s.w, s.peer, fmt.Sprintf("heard nothing from it for %s", heartbeat.SilentAfter))
}

// checkPeer checks in the background, bound to the round, whether the
// node of peer rank `peer` can be reached (Rendezvous.Unreachable: a
// probe of its agent, reported when it fails), worker w having lost
// touch with it (why). A peer on this node is a process, not a network:
// its exit or the heartbeat timeout judges it. A node whose agent is gone
// with its kernel up refuses the probe at once, so a node killed is left
// out in a fraction of its lease.
func (m *roundMonitor) checkPeer(w *worker, peer int, why string) {
	if first := m.round.FirstRank; peer < 0 || peer >= first && peer < first+len(m.workers) {
		return
	}
	m.a.log.Info().Int("rank", w.contract.Rank).Int("peer", peer).Str("why", why).Msg("worker lost touch with a peer on another node: probing that node")
	m.probes.Go(func() {
		ctx, cancel := context.WithTimeout(m.watchCtx, blameTimeout)
		defer cancel()
		if err := m.a.rdzv.Unreachable(ctx, m.round, peer); err != nil && m.watchCtx.Err() == nil {
			m.a.log.Warn().Err(err).Int("peer", peer).Msg("checking whether a peer's node can be reached")
		}
	})
}

// maxReformBackOff caps the doubling of Spec.ReformAfter (a factor of 32).
const maxReformBackOff = 5

// awaitingWorkers are this round's workers that still await a new round.
func (m *roundMonitor) awaitingWorkers() []*worker {
	var out []*worker
	for _, w := range m.workers {
		if _, ok := w.heartbeat.Awaiting(); ok && !w.endedOnItsOwn() {
			out = append(out, w)
		}
	}
	return out
}

// onReformDue: a worker awaited a new round for ReformAfter (doubled per
// re-form without progress) and none came, so no node was lost: the
// world broke on a partial network fault. The agent asks the rendezvous
// to re-form the same members; the new round then keeps the workers in
// place as for any membership change. A rendezvous that cannot leaves
// the wait to AwaitTimeout.
func (m *roundMonitor) onReformDue() {
	m.reformDue = nil
	var awaiting []int
	for _, w := range m.awaitingWorkers() {
		awaiting = append(awaiting, w.contract.Rank)
	}
	if len(awaiting) == 0 {
		return
	}
	n := m.a.reforms.Add(1)
	reason := fmt.Sprintf("ranks %v on %s lost a peer while no node was lost (a partial network fault?): the same nodes re-form", awaiting, m.a.spec.Host)
	m.a.log.Info().Ints("ranks", awaiting).Int32("reforms", n).Msg("workers await a round that does not come: asking to re-form in place")
	ctx, cancel := context.WithTimeout(m.ctx, blameTimeout)
	defer cancel()
	if err := m.a.rdzv.Reform(ctx, m.round, reason); err != nil {
		m.a.log.Warn().Err(err).Msg("re-forming in place: the workers wait for a round change")
	}
}

// onAwaitOver: workers awaited a new round for AwaitTimeout and none
// came. Those still awaiting count as failed, as a hung worker does: the
// others stop and the round ends with their failure. While this node
// cannot reach the rendezvous, they wait on.
func (m *roundMonitor) onAwaitOver() outcome {
	m.awaitOver = nil
	if !m.a.rdzv.Connected() {
		// This node is cut off from the rendezvous (a partition): the new
		// round may well exist, it just cannot hear of it. The workers keep
		// their state and wait; once the session is back, the round change
		// reaches them and they re-form in place.
		m.a.log.Warn().Dur("waited", m.a.spec.AwaitTimeout).Msg("workers still await a round, and this node cannot reach the rendezvous: they keep waiting")
		m.awaitOver = time.After(m.a.spec.AwaitTimeout)
		return nil
	}
	over := m.awaitingWorkers()
	for _, w := range over {
		if aw, ok := w.heartbeat.Awaiting(); ok {
			w.await = aw
			w.health.markFrom(abandoned, healthy, resuming, hung)
		}
	}
	if len(over) == 0 {
		return nil
	}
	m.move(StateStopping, "reason", "no new round came for a worker that awaited one", "rank", over[0].contract.Rank,
		"waited", m.a.spec.AwaitTimeout.String())
	var blamed []rendezvous.Failure
	for _, w := range over {
		blamed = append(blamed, m.a.failure(w, m.round, syscall.SIGTERM))
	}
	m.blame(blamed)
	failures := append(blamed, m.stopAll(syscall.SIGTERM)...)
	writeFailureTable(m.a.spec.Report, failures, len(m.workers)-len(failures))
	return failed{failures}
}

// onResumed: the first progress of a kept worker in its new round ends
// the in-place recovery: it is logged, and kept by node rank 0 for gorun
// status.
func (m *roundMonitor) onResumed(r resumption) {
	from := m.recovering
	if from == nil || slices.Index(m.workers, r.w) < 0 {
		return
	}
	m.recovering = nil
	m.a.reforms.Store(0)
	for _, w := range m.workers {
		w.health.mark(resuming, healthy)
	}
	rec := rendezvous.Recovery{
		Round: m.round.Number, Host: m.a.spec.Host, Reason: from.end.Reason, Lost: from.end.Lost,
		Nodes: m.round.NumNodes, Workers: m.round.WorldSize, AtStep: from.lastStep,
		StepsLost: stepsLost(from.lastStep, r), Seconds: r.at.Sub(from.endedAt).Seconds(), Time: r.at,
	}
	m.a.log.Info().Int("round", rec.Round).Int("steps_lost", rec.StepsLost).Float64("seconds", rec.Seconds).Msg(rec.String())
	if m.round.NodeRank != 0 {
		return
	}
	fmt.Fprintf(m.a.spec.Report, "gorun: %s\n", rec)
	ctx, cancel := context.WithTimeout(m.ctx, blameTimeout)
	defer cancel()
	if err := m.a.rdzv.RecordRecovery(ctx, rec); err != nil {
		m.a.log.Warn().Err(err).Msg("keeping the in-place recovery for gorun status")
	}
}

// stepsLost is the steps a recovery threw away: what the worker says
// (its exchange's decision, alike on every rank of the job), else this
// node's own view, the last step its workers reported before the change
// (lastStep) minus the step they went on after. That view is only this
// node's: a node that was cut off and rejoins went on after its own last
// step, so it would record 0 for a rollback of the whole job, and a
// running node 0 would not see steps redone elsewhere.
func stepsLost(lastStep int, r resumption) int {
	if !math.IsNaN(r.redone) && r.redone >= 0 {
		return int(r.redone)
	}
	return max(0, lastStep-(r.step-1))
}

// onStall: worker s.i sent no heartbeat for HeartbeatTimeout. A hung
// worker holds every other in a collective, so all stop beating
// together: a worker here that is stopped or stuck in the kernel (state
// T or D) is the culprit; else the rendezvous decides which node names
// one.
func (m *roundMonitor) onStall(s stallOf) {
	if w := m.workers[s.i]; w.stall == nil {
		w.stall = &s.stall
	}
	if m.judging {
		return
	}
	m.judging = true
	i, stall := s.i, &s.stall
	j := suspectWorker(m.workers)
	if j < 0 {
		go func() {
			blame, err := m.a.rdzv.Stalled(m.watchCtx, m.round)
			if err != nil {
				if m.watchCtx.Err() != nil {
					return
				}
				// The other nodes cannot be asked: judge here rather than
				// leave the hang unjudged.
				m.a.log.Warn().Err(err).Msg("could not report the stall to the other nodes: naming a culprit here")
				blame = true
			}
			m.verdict <- blame
		}()
		m.a.log.Info().Int("rank", m.workers[i].contract.Rank).Stringer("stall", stall).Msg("workers stalled, none stopped here: asking the other nodes")
		return
	}
	w := m.workers[j]
	if w.stall == nil {
		w.stall = stall
	}
	w.health.markFrom(suspect, healthy, resuming, hung)
	// A stopped process cannot dump its stacks: kill it now, once the
	// blame is on record.
	m.blame([]rendezvous.Failure{m.a.failure(w, m.round, syscall.SIGKILL)})
	m.a.log.Warn().Int("rank", w.contract.Rank).Str("state", procState(w.process.PID())).Stringer("stall", w.stall).Msg("worker hung (stopped or stuck in the kernel): SIGKILL")
	_ = w.process.Signal(syscall.SIGKILL)
}

// onVerdict: every node's workers stalled with no stopped process
// anywhere; if blame, this node names its longest-silent worker, asks it
// for a stack dump and kills it StackDumpGrace later.
func (m *roundMonitor) onVerdict(blame bool) {
	if !blame {
		return // another node names the culprit; the round ends there
	}
	w := m.workers[longestSilent(m.workers)]
	if w.stall == nil {
		for _, o := range m.workers {
			if o.stall != nil {
				w.stall = o.stall
				break
			}
		}
	}
	w.health.markFrom(judged, healthy, resuming, hung)
	m.blame([]rendezvous.Failure{m.a.failure(w, m.round, syscall.SIGQUIT)})
	m.a.log.Warn().Int("rank", w.contract.Rank).Stringer("stall", w.stall).Msg("worker hung: SIGQUIT for a stack dump, then SIGKILL")
	_ = w.process.Signal(syscall.SIGQUIT)
	go func() {
		select {
		case <-w.process.Done():
		case <-time.After(StackDumpGrace):
			_ = w.process.Signal(syscall.SIGKILL)
		}
	}()
}

// onWarmDue: the round's workers here made their first step, or ran for
// Spec.WarmDelay: the next round's warm workers start, once.
func (m *roundMonitor) onWarmDue() {
	m.warmDue, m.firstStep = nil, nil
	m.a.warmUp()
}

// onPassOn: SIGUSR1/SIGUSR2 go to every worker, which keep running.
func (m *roundMonitor) onPassOn(s syscall.Signal) {
	m.a.log.Info().Str("signal", unix.SignalName(s)).Msg("passing signal on to workers")
	m.a.signalled.Store(true)
	for _, w := range m.workers {
		_ = w.process.Signal(s)
	}
}

// onStop: a stop signal (or ctx ending) stops the workers with it.
func (m *roundMonitor) onStop() outcome {
	m.move(StateStopping, "reason", context.Cause(m.ctx).Error())
	sig := stoppedBy(m.ctx)
	m.a.stopAll(m.workers, sig)
	return stopped{sig}
}

// stopAll stops every worker with sig and returns the failures of those
// that had ended on their own before it did.
func (m *roundMonitor) stopAll(sig syscall.Signal) []rendezvous.Failure {
	var ended []*worker
	for _, w := range m.workers {
		if w.endedOnItsOwn() {
			ended = append(ended, w)
		}
	}
	m.a.stopAll(m.workers, sig)
	return m.a.failures(ended, m.round)
}

// blame records failures with the rendezvous before the agent acts on
// them; a rendezvous that does not answer in time is logged and the agent
// acts anyway.
func (m *roundMonitor) blame(failures []rendezvous.Failure) {
	ctx, cancel := context.WithTimeout(m.ctx, blameTimeout)
	defer cancel()
	if err := m.a.rdzv.Blame(ctx, m.round, failures); err != nil {
		m.a.log.Warn().Err(err).Msg("recording the failure before acting on it")
	}
}
