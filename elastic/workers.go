package elastic

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/internal/proc"
	"github.com/gorun/gorun/internal/proc/procfs"
	"github.com/gorun/gorun/internal/workerlog"
	"github.com/gorun/gorun/rendezvous"
)

// StackDumpGrace is how long a hung worker gets to print its stacks after
// SIGQUIT before it is killed.
const StackDumpGrace = 3 * time.Second

// worker is one running worker process: of one round, or of several
// when it is kept in place across rounds.
type worker struct {
	// contract is its place in the current round: set by the agent's
	// round loop only (current is the copy other goroutines read).
	contract  distenv.Worker
	started   distenv.Worker // the contract it was started with (its environment)
	current   atomic.Pointer[distenv.Worker]
	process   *proc.Process
	logs      *workerlog.Worker
	heartbeat *heartbeat.Pipe // nil unless the agent judges hangs, reports progress or keeps workers in place
	health    healthCell
	// stall is the stall of a worker whose heartbeats stopped, or the one
	// it is blamed for; await is the wait of an abandoned one. Both are
	// the round monitor's: only the agent's round loop reads them.
	stall       *heartbeat.Stall
	await       heartbeat.Await
	startedWarm bool // a warm worker taken by a round (Spec.Warm)
	// observed is set once the observer heard that the worker started: a
	// standby or warm worker's exit is not told before a round takes it.
	observed atomic.Bool
	released chan struct{} // closed once the agent is done with the worker
	// exitTold is closed once the observer was told the process ended:
	// release waits for it, so every exit is reported before Run returns.
	exitTold chan struct{}
}

// observe tells the observer that w started, under its current contract,
// and from now on of its progress and its exit.
func (w *worker) observe(o Observer) {
	w.observed.Store(true)
	o.WorkerStarted(*w.current.Load())
}

// setContract makes c the worker's place in the current round.
func (w *worker) setContract(c distenv.Worker) {
	w.contract = c
	w.current.Store(&c)
}

// resumption is the first progress of a kept worker in its new round.
type resumption struct {
	w    *worker
	step int
	at   time.Time
	// redone is the steps the worker says the recovery threw away
	// (heartbeat.Progress.Redone); NaN when it does not say.
	redone float64
}

// endsWithin reports whether w's process ends within d: for a worker
// whose channel closed, which only an exiting one does.
func (w *worker) endsWithin(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.process.Done():
		return true
	case <-t.C:
		return false
	}
}

// endedOnItsOwn reports whether w's process has ended (reaped, or a
// zombie not yet reaped): called before the agent signals it, that means
// it ended for a reason of its own.
func (w *worker) endedOnItsOwn() bool {
	select {
	case <-w.process.Done():
		return true
	default:
	}
	p, err := procfs.Stat(w.process.PID())
	// A zombie, or a process in exit (PF_EXITING is set before its files
	// close, so a peer that saw its connections break finds the cause
	// already exiting: causal, not a race with the reaper).
	return err == nil && (p.Zombie() || p.Exiting())
}

// procState is the one-letter state of process pid ("R", "S", "D", "T",
// ...), or "" when it cannot be read.
func procState(pid int) string {
	p, err := procfs.Stat(pid)
	if err != nil {
		return ""
	}
	return string(p.State)
}

// suspectWorker is the index of a worker that is stopped (T, t) or in
// uninterruptible sleep (D): the likely cause of a hang. -1: none.
func suspectWorker(workers []*worker) int {
	for i, w := range workers {
		switch procState(w.process.PID()) {
		case "T", "t", "D":
			return i
		}
	}
	return -1
}

// longestSilent is the index of the worker whose last heartbeat is the
// oldest: in a hang with no stopped process, the likeliest culprit.
func longestSilent(workers []*worker) int {
	best := -1
	for i, w := range workers {
		if w.heartbeat == nil || w.heartbeat.LastBeat().IsZero() {
			continue
		}
		if best < 0 || w.heartbeat.LastBeat().Before(workers[best].heartbeat.LastBeat()) {
			best = i
		}
	}
	return max(best, 0)
}

// startWorkers starts every worker of this node for round r, with extra
// variables over their environment; on error it returns those it started.
func (a *Agent) startWorkers(sink *workerlog.Sink, r rendezvous.Round, extra []string) ([]*worker, error) {
	var workers []*worker
	var warm []int // the pids of the warm workers taken
	for local := 0; local < a.spec.LocalWorkers; local++ {
		w, err := a.startWorker(sink, r, local, extra)
		if err != nil {
			return workers, err
		}
		if w.startedWarm {
			warm = append(warm, w.process.PID())
		}
		workers = append(workers, w)
	}
	if o, ok := a.spec.Observer.(StartObserver); ok {
		o.WorkersStarted(len(warm), len(workers)-len(warm))
	}
	if a.spec.Warm != nil {
		a.log.Info().Int("round", r.Number).Ints("warm_pids", warm).Int("fresh", len(workers)-len(warm)).
			Msg("the round's workers started: warm ones given their environment, fresh ones where none was ready")
	}
	return workers, nil
}

// startWorker starts local worker `local` of this node for round r, with
// extra variables over its environment: the warm worker of that local
// rank, if there is one, else a fresh process.
func (a *Agent) startWorker(sink *workerlog.Sink, r rendezvous.Round, local int, extra []string) (*worker, error) {
	c := a.spec.Contract(r, local)
	if w := a.takeWarm(sink, c, extra); w != nil {
		return w, nil
	}
	return a.launch(sink, c, asRoundWorker, extra)
}

// freshErrorFile makes the directory of c's error file and removes a
// stale file there, which would name an old error.
func freshErrorFile(c distenv.Worker) error {
	if err := os.MkdirAll(filepath.Dir(c.ErrorFile), 0o755); err != nil {
		return fmt.Errorf("error file of rank %d: %w", c.Rank, err)
	}
	_ = os.Remove(c.ErrorFile)
	return nil
}

// aheadSink is the sink of the output of workers started ahead of their
// round (kind "standby" or "warm"): a placeholder run id keeps their
// files out of the job's attempts until a round takes them (their output
// moves there).
func (a *Agent) aheadSink(kind string) (*workerlog.Sink, error) {
	cfg := a.spec.Logs
	cfg.Host, cfg.RunID, cfg.Attempt = a.spec.Host, a.spec.RunID+"-"+kind+"-"+a.spec.Host, 0
	return workerlog.New(cfg)
}

// startAs is what a process launch starts.
type startAs int

const (
	// asRoundWorker: the worker of a round, under its contract.
	asRoundWorker startAs = iota
	// asStandby: a hot spare's worker (Spec.InPlace), under a placeholder
	// contract and heartbeat.StandbyEnvVar, until a round adopts it.
	asStandby
	// asWarm: a warm worker (Spec.Warm), under a placeholder contract,
	// until a round gives it its environment (takeWarm).
	asWarm
)

// workerEnv is the whole environment of a worker under contract c, with
// extra variables (KEY=VALUE) over it.
func (a *Agent) workerEnv(c distenv.Worker, extra []string) []string {
	env := append(c.Environ(a.spec.Environ), extra...)
	if a.wantsHeartbeats() {
		env = append(env, fmt.Sprintf("%s=%d", heartbeat.EnvVar, heartbeat.WorkerFD))
	}
	return env
}

// launch starts a worker process under contract c, with extra variables
// (KEY=VALUE) over its environment; the observer hears of a standby or
// warm one only once a round takes it.
func (a *Agent) launch(sink *workerlog.Sink, c distenv.Worker, as startAs, extra []string) (*worker, error) {
	local := c.LocalRank
	logs, err := sink.Worker(c.Rank, c.LocalRank)
	if err != nil {
		return nil, err
	}
	if err := freshErrorFile(c); err != nil {
		logs.Close()
		return nil, err
	}
	command := a.spec.Command
	if as == asWarm {
		command = a.spec.Warm
	}
	spec := proc.Spec{
		Path: command[0], Args: command[1:], Env: a.workerEnv(c, extra),
		Stdout: logs.Stdout(), Stderr: logs.Stderr(), Guard: a.spec.Guard,
		Stdin: a.spec.Stdin, Linger: a.spec.TermTimeout,
	}
	if as == asStandby {
		spec.Env = append(spec.Env, heartbeat.StandbyEnvVar+"=1")
	}
	if local < len(a.spec.WorkerCPUs) {
		spec.CPUs = a.spec.WorkerCPUs[local]
	}
	var beat *heartbeat.Pipe
	if a.wantsHeartbeats() {
		if beat, err = heartbeat.NewPipe(); err != nil {
			logs.Close()
			return nil, err
		}
		spec.ExtraFiles = []*os.File{beat.WorkerEnd()}
	}
	p, err := proc.Start(spec)
	if beat != nil {
		_ = beat.CloseWorkerEnd()
	}
	if err != nil {
		logs.Close()
		return nil, fmt.Errorf("start rank %d: %w", c.Rank, err)
	}
	a.workerPIDs.Store(p.PID(), struct{}{})
	w := &worker{started: c, process: p, logs: logs, heartbeat: beat, released: make(chan struct{}), exitTold: make(chan struct{})}
	w.setContract(c)
	if as == asRoundWorker {
		w.observe(a.spec.Observer)
	}
	if beat != nil {
		beat.OnBeat(func(prog heartbeat.Progress) { a.onProgress(w, prog) })
		beat.OnAwait(func(heartbeat.Await) {
			select {
			case a.awaits <- w:
			default: // the monitor checks every worker when its bound is over
			}
		})
		beat.OnSilent(func(peer int) {
			select {
			case a.silent <- silence{w: w, peer: peer}:
			default: // the other workers that hear nothing from that node say so too
			}
		})
	}
	go a.followExit(w)
	a.log.Debug().Int("rank", c.Rank).Int("local_rank", local).Int("pid", p.PID()).Msg("worker started")
	return w, nil
}

// onProgress passes a worker's heartbeat on to the observer and, for the
// first one of a kept worker in its new round, to the monitor.
func (a *Agent) onProgress(w *worker, prog heartbeat.Progress) {
	c := *w.current.Load()
	a.spec.Observer.WorkerProgress(c, prog)
	if !math.IsNaN(prog.Round) && int(prog.Round) != c.RestartCount {
		return // a step of the round before, finished after the agent sent the new one
	}
	if w.health.mark(resuming, healthy) {
		select {
		case a.resumed <- resumption{w: w, step: prog.Step, at: time.Now(), redone: prog.Redone}:
		default:
		}
	}
}

// followExit tells the observer and the monitor of the round (whichever
// round it is then) that w's process ended.
func (a *Agent) followExit(w *worker) {
	<-w.process.Done()
	if w.observed.Load() {
		a.spec.Observer.WorkerExited(*w.current.Load(), w.process.Result().ExitCode)
	}
	close(w.exitTold)
	select {
	case a.exits <- w:
	case <-w.released:
	}
}

// release ends the agent's part in workers whose processes are reaped:
// their log files, channels and timer entries. It returns once the
// observer was told of every one's exit.
func (a *Agent) release(workers []*worker) {
	for _, w := range workers {
		<-w.exitTold
		w.logs.Close()
		if w.heartbeat != nil {
			_ = w.heartbeat.Close()
		}
		a.workerPIDs.Delete(w.process.PID())
		a.timedOut.Delete(w.process.PID())
		close(w.released)
	}
}

// discard stops kept workers that cannot go on into the next round and
// releases them (nil entries, places not filled, are skipped); why says
// why, for the log.
func (a *Agent) discard(workers []*worker, sig syscall.Signal, why string) {
	workers = slices.DeleteFunc(slices.Clone(workers), func(w *worker) bool { return w == nil })
	a.log.Warn().Str("reason", why).Int("workers", len(workers)).Msg("stopping the workers kept in place")
	a.stopAll(workers, sig)
	a.release(workers)
}

// adopt returns round r's workers, by local rank, from the workers k
// kept from round from (nil: a hot spare's, which ran none): it gives
// each its contract in r over its channel, and starts a fresh worker in
// each place that k replaces (one that failed and is restarted alone). A
// kept worker that ended meanwhile, or that can no longer be told because
// it is ending (its channel closed: only an exiting worker closes it),
// failed as the round changed, beside the failure that changed it: two
// workers of different nodes that die at once. It is recorded as a
// failure of round from (if any) and restarted alone too, since r
// re-forms its world anyway: the exchange finds what every rank holds.
// At a step boundary (k.atBoundary: the world is intact, only nodes join,
// and the kept workers go into r at the next step boundary their world
// agrees on, so that no rank is left a step ahead) no worker can be
// replaced: it fails, sending nothing more. On error it returns the
// workers it holds then (nil where a place is not filled), and the caller
// stops them all and starts fresh workers, as after any restart.
func (a *Agent) adopt(ctx context.Context, from *rendezvous.Round, r rendezvous.Round, k *keep) ([]*worker, error) {
	if len(k.workers)+len(k.replace) != a.spec.LocalWorkers {
		return k.workers, fmt.Errorf("%d workers kept and %d replaced, %d wanted", len(k.workers), len(k.replace), a.spec.LocalWorkers)
	}
	workers := make([]*worker, a.spec.LocalWorkers)
	for _, w := range k.workers {
		workers[w.contract.LocalRank] = w
	}
	for local, w := range workers {
		if w != nil && w.endedOnItsOwn() {
			if k.atBoundary() {
				return workers, fmt.Errorf("rank %d ended while the round changed: %s", w.contract.Rank, w.process.Result())
			}
			a.lostAsRoundChanged(ctx, from, w)
			workers[local] = nil
		}
	}
	sink, err := a.sinkOf(r)
	if err != nil {
		return workers, err
	}
	for local, w := range workers {
		if w == nil {
			if err := a.restartAlone(sink, r, workers, local); err != nil {
				return workers, err
			}
			continue
		}
		c := a.spec.Contract(r, local)
		if err := freshErrorFile(c); err != nil {
			return workers, err
		}
		if err := w.logs.Move(sink, c.Rank, c.LocalRank); err != nil {
			return workers, fmt.Errorf("output of rank %d: %w", c.Rank, err)
		}
		w.health.mark(healthy, resuming) // a worker still resuming from the round before stays so
		if err := w.heartbeat.SendRound(c, k.atBoundary()); err != nil {
			if k.atBoundary() || !w.endsWithin(a.spec.TermTimeout) {
				return workers, err
			}
			a.lostAsRoundChanged(ctx, from, w)
			workers[local] = nil
			sink.Vacate(c.Rank) // its output moved there, and is closed
			if err := a.restartAlone(sink, r, workers, local); err != nil {
				return workers, err
			}
			continue
		}
		a.log.Debug().Int("rank", c.Rank).Int("was", w.contract.Rank).Int("pid", w.process.PID()).Msg("worker kept in place")
		w.setContract(c)
		w.observe(a.spec.Observer)
	}
	a.log.Info().Int("round", r.Number).Int("workers", len(workers)).Int("world_size", r.WorldSize).Msg("sent the new round to its workers")
	return workers, nil
}

// restartAlone starts a fresh worker for local rank local of round r in
// the empty place workers[local].
func (a *Agent) restartAlone(sink *workerlog.Sink, r rendezvous.Round, workers []*worker, local int) error {
	fresh, err := a.startWorker(sink, r, local, nil)
	if err != nil {
		return err
	}
	workers[local] = fresh
	a.log.Info().Int("rank", fresh.contract.Rank).Int("pid", fresh.process.PID()).Msg("worker restarted alone: it takes its state from its peers")
	return nil
}

// lostAsRoundChanged records kept worker w, which ended while the round
// changed, as a failure of round from (none for a hot spare's), reports it
// and releases it. A rendezvous that does not answer in time is logged and
// the agent goes on.
func (a *Agent) lostAsRoundChanged(ctx context.Context, from *rendezvous.Round, w *worker) {
	<-w.process.Done()
	a.log.Warn().Int("rank", w.contract.Rank).Str("result", w.process.Result().String()).
		Msg("worker ended while the round changed: restarting it alone")
	if from != nil {
		f := a.failure(w, *from, syscall.SIGKILL)
		fmt.Fprintf(a.spec.Report, "gorun: %s: restarting rank %d alone in the next round\n", f, w.contract.Rank)
		bctx, cancel := context.WithTimeout(ctx, blameTimeout)
		defer cancel()
		if err := a.rdzv.Blame(bctx, *from, []rendezvous.Failure{f}); err != nil {
			a.log.Warn().Err(err).Msg("recording the failure of a worker that ended while the round changed")
		}
	}
	a.release([]*worker{w})
}

// wantsHeartbeats says whether workers get a heartbeat channel: to judge
// hangs, to report their progress to an observer, or to be kept in place
// across rounds.
func (a *Agent) wantsHeartbeats() bool {
	return a.spec.HeartbeatTimeout > 0 || a.observed || a.spec.InPlace || a.spec.Warm != nil
}

// stopAll sends sig to every worker's process group, waits TermTimeout for
// them to end, then kills what is left; a second stop signal kills at
// once. It returns when every worker is reaped.
func (a *Agent) stopAll(workers []*worker, sig syscall.Signal) {
	ps := make([]*proc.Process, len(workers))
	for i, w := range workers {
		ps[i] = w.process
	}
	if proc.StopAll(ps, sig, a.spec.TermTimeout, a.kill) && !isClosed(a.kill) {
		a.log.Warn().Dur("grace", a.spec.TermTimeout).Msg("workers still running after the grace period: SIGKILL")
	}
}

// isClosed says whether ch is closed (nil never is).
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
