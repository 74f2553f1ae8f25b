package elastic

import (
	"context"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/workerlog"
	"github.com/gorun/gorun/rendezvous"
)

// roundResult is how this node's part of a round came out.
type roundResult struct {
	failures []rendezvous.Failure // this node's workers that failed
	ended    *rendezvous.End      // the round ended elsewhere first
	requeue  bool                 // the workers checkpointed on request and stopped
}

// blameTimeout bounds the report of a culprit before the agent acts on
// it: the rendezvous must not keep a hung worker alive.
const blameTimeout = 5 * time.Second

// runRound starts this node's workers for round r and watches them until
// they all succeeded, one failed (then the others are stopped), the round
// ended elsewhere, or ctx ended (a stop signal: then all are stopped with
// it). It fails only when the workers could not be started.
func (a *Agent) runRound(ctx context.Context, r rendezvous.Round) (roundResult, error) {
	cfg := a.spec.Logs
	cfg.Host, cfg.RunID, cfg.Attempt = a.spec.Host, a.spec.RunID, r.Number
	sink, err := workerlog.New(cfg)
	if err != nil {
		return roundResult{}, err
	}
	workers, err := a.startWorkers(sink, r)
	defer func() {
		for _, w := range workers {
			w.logs.Close()
			a.workerPIDs.Delete(w.process.PID())
			a.timedOut.Delete(w.process.PID())
		}
	}()
	if err != nil {
		a.stopAll(workers, syscall.SIGTERM)
		return roundResult{}, err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	m := &roundMonitor{
		a: a, ctx: ctx, watchCtx: watchCtx, round: r, workers: workers, running: len(workers),
		exited: make(chan int, len(workers)), stalled: make(chan int, len(workers)), verdict: make(chan bool, 1),
		roundEnd: a.rdzv.Watch(watchCtx, r),
	}
	m.watchWorkers()
	return m.run(), nil
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

	exited   chan int              // index of a reaped worker
	stalled  chan int              // index of a worker whose heartbeats stopped
	verdict  chan bool             // the rendezvous's answer to a stall with no culprit here
	roundEnd <-chan rendezvous.End // the round ended elsewhere
	requeue  <-chan time.Time      // set once a worker stopped to be requeued
	judging  bool                  // a hang is being judged: later stalls are the same hang
}

// watchWorkers turns each worker's end and heartbeat stall into events.
func (m *roundMonitor) watchWorkers() {
	for i, w := range m.workers {
		go func() {
			<-w.process.Done()
			m.a.spec.Observer.WorkerExited(w.contract, w.process.Result().ExitCode)
			m.exited <- i
		}()
		if w.heartbeat != nil {
			go func() {
				if stall, ok := <-w.heartbeat.Watch(m.watchCtx, m.a.spec.HeartbeatTimeout); ok {
					w.hung.Store(&stall)
					m.stalled <- i
				}
			}()
		}
	}
}

// run handles events until the round is over for this node.
func (m *roundMonitor) run() roundResult {
	for m.running > 0 {
		var done *roundResult
		select {
		case i := <-m.exited:
			done = m.onExit(i)
		case <-m.requeue:
			done = m.onRequeueGraceOver()
		case end, ok := <-m.roundEnd:
			done = m.onRoundEnd(end, ok)
		case i := <-m.stalled:
			m.onStall(i)
		case blame := <-m.verdict:
			m.onVerdict(blame)
		case s := <-m.a.passOn:
			m.onPassOn(s)
		case <-m.ctx.Done():
			done = m.onStop()
		}
		if done != nil {
			return *done
		}
	}
	return roundResult{requeue: m.requeue != nil}
}

// onExit: a worker ended. Success or a requeue exit lets the others go
// on; a failure stops them and ends the round.
func (m *roundMonitor) onExit(i int) *roundResult {
	m.running--
	w := m.workers[i]
	res := w.process.Result()
	if res.Success() {
		m.a.log.Info().Int("rank", w.contract.Rank).Msg("worker succeeded")
		return nil
	}
	if m.requeue != nil || (res.Signal == 0 && res.ExitCode == ExitRequeue) {
		// The workers agreed on a checkpoint and stop one by one; the rest
		// get TermTimeout to follow.
		if m.requeue == nil {
			m.a.log.Warn().Int("rank", w.contract.Rank).Msg("worker checkpointed on request and stopped: requeue")
			m.requeue = time.After(m.a.spec.TermTimeout)
		}
		return nil
	}
	m.a.transition(StateStopping, "reason", "worker failed", "rank", w.contract.Rank, "result", res.String())
	failures := m.stopAll(syscall.SIGTERM)
	writeFailureTable(m.a.spec.Report, failures, len(m.workers)-len(failures))
	return &roundResult{failures: failures}
}

// onRequeueGraceOver: workers still run TermTimeout after one stopped to
// be requeued.
func (m *roundMonitor) onRequeueGraceOver() *roundResult {
	m.a.transition(StateStopping, "reason", "requeue: workers still running after the grace period")
	m.stopAll(syscall.SIGTERM)
	return &roundResult{requeue: true}
}

// onRoundEnd: the round ended elsewhere (or ok is false: the watch ended
// with ctx, handled by onStop). The workers stop; any that had already
// failed on their own are still reported, after the failures that ended
// the round.
func (m *roundMonitor) onRoundEnd(end rendezvous.End, ok bool) *roundResult {
	if !ok {
		m.roundEnd = nil
		return nil
	}
	m.a.transition(StateStopping, "reason", end.Reason)
	failures := m.stopAll(syscall.SIGTERM)
	if m.requeue != nil || slices.ContainsFunc(failures, isRequeue) {
		// The workers were stopping to be requeued (SLURM's --signal) when
		// the round ended: most likely a node whose workers stopped first
		// left. The job is to be requeued, not re-formed without it.
		return &roundResult{requeue: true}
	}
	if len(failures) > 0 {
		writeFailureTable(m.a.spec.Report, failures, len(m.workers)-len(failures))
		m.blame(failures)
	}
	return &roundResult{ended: &end}
}

// isRequeue says whether f is a worker that checkpointed on request and
// stopped (ExitRequeue), not a failure.
func isRequeue(f rendezvous.Failure) bool { return f.Signal == "" && f.ExitCode == ExitRequeue }

// onStall: worker i sent no heartbeat for HeartbeatTimeout. A hung worker
// holds every other in a collective, so all stop beating together: a
// worker here that is stopped or stuck in the kernel (state T or D) is
// the culprit; else the rendezvous decides which node names one.
func (m *roundMonitor) onStall(i int) {
	if m.judging {
		return
	}
	m.judging = true
	stall := m.workers[i].hung.Load()
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
	w.hung.CompareAndSwap(nil, stall)
	w.judged.Store(true)
	w.suspect.Store(true)
	// A stopped process cannot dump its stacks: kill it now, once the
	// blame is on record.
	m.blame([]rendezvous.Failure{m.a.failure(w, m.round, syscall.SIGKILL)})
	m.a.log.Warn().Int("rank", w.contract.Rank).Str("state", procState(w.process.PID())).Stringer("stall", w.hung.Load()).Msg("worker hung (stopped or stuck in the kernel): SIGKILL")
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
	if stall := w.hung.Load(); stall == nil {
		for _, o := range m.workers {
			if s := o.hung.Load(); s != nil {
				w.hung.CompareAndSwap(nil, s)
				break
			}
		}
	}
	w.judged.Store(true)
	m.blame([]rendezvous.Failure{m.a.failure(w, m.round, syscall.SIGQUIT)})
	m.a.log.Warn().Int("rank", w.contract.Rank).Stringer("stall", w.hung.Load()).Msg("worker hung: SIGQUIT for a stack dump, then SIGKILL")
	_ = w.process.Signal(syscall.SIGQUIT)
	go func() {
		select {
		case <-w.process.Done():
		case <-time.After(StackDumpGrace):
			_ = w.process.Signal(syscall.SIGKILL)
		}
	}()
}

// onPassOn: SIGUSR1/SIGUSR2 go to every worker, which keep running.
func (m *roundMonitor) onPassOn(s syscall.Signal) {
	m.a.log.Info().Str("signal", unix.SignalName(s)).Msg("passing signal on to workers")
	for _, w := range m.workers {
		_ = w.process.Signal(s)
	}
}

// onStop: a stop signal (or ctx ending) stops the workers with it.
func (m *roundMonitor) onStop() *roundResult {
	m.a.transition(StateStopping, "reason", context.Cause(m.ctx).Error())
	m.a.stopAll(m.workers, stoppedBy(m.ctx))
	return &roundResult{}
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
