package elastic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/filetimer"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/internal/proc"
	"github.com/gorun/gorun/internal/workerlog"
	"github.com/gorun/gorun/rendezvous"
)

// Rendezvous forms the rounds of a job and decides, across nodes, how each
// ends. rendezvous.Static and *rendezvous.Elastic implement it.
type Rendezvous interface {
	// Next blocks until this node's next round runs.
	Next(ctx context.Context) (rendezvous.Round, error)
	// Watch sends one End when round r is over for a reason that is not
	// this node's own (another node failed or left, the job closed).
	Watch(ctx context.Context, r rendezvous.Round) <-chan rendezvous.End
	// Failed reports this node's worker failures in r and says how r ends:
	// a restart, or the job closed as failed.
	Failed(ctx context.Context, r rendezvous.Round, failures []rendezvous.Failure) (rendezvous.End, error)
	// Succeeded reports that this node's workers succeeded in r and waits
	// until the job closed or a new round opened.
	Succeeded(ctx context.Context, r rendezvous.Round) (rendezvous.End, error)
	// Failures returns every failure reported in the job, first first.
	Failures(ctx context.Context) ([]rendezvous.Failure, error)
}

// Spec is what the agent runs on its node.
type Spec struct {
	RunID        string
	Host         string   // the name this node announces; prefixes worker output
	LocalWorkers int      // workers on this node
	Role         string   // ROLE_NAME
	Command      []string // argv of every worker
	Environ      []string // environment the workers inherit under the contract's variables
	VisibleGPUs  []string // CUDA_VISIBLE_DEVICES for the workers; nil leaves it as inherited
	MaxRestarts  int      // TORCHELASTIC_MAX_RESTARTS (the budget itself is the rendezvous's)
	TermTimeout  time.Duration
	// Logs says where worker output goes; the agent fills in Host, RunID
	// and Attempt.
	Logs workerlog.Config
	// ErrorDir holds the workers' TORCHELASTIC_ERROR_FILEs:
	// <ErrorDir>/attempt_<n>/<rank>/error.json. With a log dir, make it
	// <log dir>/<run id>, so they sit beside the rank's log files.
	ErrorDir string
	// Guard, when not nil, kills the workers' process groups if gorun
	// itself dies without stopping them.
	Guard *proc.Guard
	// Report receives the failure tables (gorun's stderr).
	Report io.Writer
	// Signals delivers the signals gorun caught. SIGTERM, SIGINT, SIGHUP
	// and SIGQUIT stop the workers (the same signal, then SIGKILL after
	// TermTimeout; a second one kills at once); SIGUSR1 and SIGUSR2 are
	// passed on to the workers, which keep running.
	Signals <-chan os.Signal
	// HeartbeatTimeout, when positive, judges a worker hung when it sent
	// a heartbeat (GORUN_HEARTBEAT_FD; the embedded trainer does, each
	// step) and then none for this long: the agent asks it for a stack
	// dump (SIGQUIT), kills it after StackDumpGrace, and handles it as a
	// failed worker. Workers that never send one are never judged.
	HeartbeatTimeout time.Duration
	// TimerFile, when set, is where the agent serves torch's file-based
	// timer protocol (TORCHELASTIC_TIMER_FILE): a worker whose timer
	// expires gets the signal it asked for and counts as failed.
	TimerFile string
	// NewBackOff gives the delay before rejoining after a worker failure;
	// nil is an exponential back-off from 100 ms to 5 s.
	NewBackOff func() backoff.BackOff
	Log        zerolog.Logger
}

// Validate reports what makes spec unusable.
func (s *Spec) Validate() error {
	switch {
	case s.LocalWorkers < 1:
		return fmt.Errorf("elastic: %d local workers", s.LocalWorkers)
	case len(s.Command) == 0:
		return errors.New("elastic: no worker command")
	case s.MaxRestarts < 0:
		return fmt.Errorf("elastic: max restarts %d < 0", s.MaxRestarts)
	case s.ErrorDir == "":
		return errors.New("elastic: no directory for worker error files")
	}
	return nil
}

// Contract is the environment contract of local worker localRank in round r.
func (s *Spec) Contract(r rendezvous.Round, localRank int) distenv.Worker {
	rank := r.FirstRank + localRank
	return distenv.Worker{
		Rank: rank, LocalRank: localRank,
		WorldSize: r.WorldSize, LocalWorldSize: s.LocalWorkers,
		GroupRank: r.NodeRank, GroupWorldSize: r.NumNodes, RoleName: s.Role,
		MasterAddr: r.MasterAddr, MasterPort: r.MasterPort,
		RestartCount: r.Number, MaxRestarts: s.MaxRestarts, RunID: s.RunID,
		ErrorFile:   filepath.Join(s.ErrorDir, fmt.Sprintf("attempt_%d", r.Number), fmt.Sprint(rank), "error.json"),
		VisibleGPUs: s.VisibleGPUs,
	}
}

// Outcome is how the job ended on this node.
type Outcome struct {
	// ExitCode is 0 when the job succeeded, else the first failure's exit
	// code across all nodes, or 128+N when signal N stopped this node.
	ExitCode int
	// Failures are the job's failures, first first.
	Failures []rendezvous.Failure
	Restarts int       // the last round's number
	Signal   os.Signal // the signal that stopped this node, if any
	Reason   string    // why the job ended, as the rendezvous says
	Requeue  bool      // the workers checkpointed on request: requeue the job to resume it
}

// Agent runs one node's workers through the rounds of a job.
type Agent struct {
	spec  Spec
	rdzv  Rendezvous
	state State
	log   zerolog.Logger

	kill   chan struct{} // closed at a second stop signal
	passOn chan syscall.Signal

	workerPIDs sync.Map // pid -> struct{}: this round's workers, for the timer server
	timedOut   sync.Map // pid -> filetimer.Expiry: workers whose watchdog timer expired
}

// New returns an agent for spec that forms rounds with rdzv.
func New(spec Spec, rdzv Rendezvous) (*Agent, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if spec.NewBackOff == nil {
		spec.NewBackOff = func() backoff.BackOff {
			b := backoff.NewExponentialBackOff()
			b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 100*time.Millisecond, 5*time.Second, 0
			return b
		}
	}
	if spec.Report == nil {
		spec.Report = io.Discard
	}
	return &Agent{
		spec: spec, rdzv: rdzv, log: spec.Log.With().Str("component", "agent").Logger(),
		kill: make(chan struct{}), passOn: make(chan syscall.Signal, 4),
	}, nil
}

// State is the agent's current state; only meaningful from Run's goroutine.
func (a *Agent) State() State { return a.state }

func (a *Agent) transition(to State, fields ...any) {
	ev := a.log.Info().Stringer("from", a.state).Stringer("to", to)
	if len(fields) > 0 {
		ev = ev.Fields(fields)
	}
	ev.Msg("agent state")
	a.state = to
}

// stopSignal is the cause of Run's context when a stop signal arrived.
type stopSignal struct{ sig syscall.Signal }

func (s stopSignal) Error() string { return "stopped by " + unix.SignalName(s.sig) }

// Run runs the job until it closes (every node's workers succeeded, or
// a budget is spent), a stop signal arrives, or ctx ends (as SIGTERM). It
// returns an error only when the agent itself could not go on (a worker
// could not be started, the rendezvous failed); no worker is left running
// when it returns, whatever the outcome.
//
// Run is two actors under one errgroup: the signal handler, which turns
// the first stop signal into the cancellation of the job's context, and
// the round loop, whose end stops the signal handler.
func (a *Agent) Run(ctx context.Context) (Outcome, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if a.spec.TimerFile != "" {
		srv, err := filetimer.Serve(ctx, a.spec.TimerFile, func(pid int) bool {
			_, ok := a.workerPIDs.Load(pid)
			return ok
		})
		if err != nil {
			return Outcome{ExitCode: 1}, err
		}
		defer srv.Close()
		go func() {
			for e := range srv.Expired() {
				a.timedOut.Store(e.PID, e)
				a.log.Warn().Int("pid", e.PID).Str("scope", e.Scope).Str("signal", unix.SignalName(e.Signal)).Msg("worker's watchdog timer expired: signalled")
			}
		}()
	}
	// The signal handler outlives the job's context: a second stop signal
	// must still reach it while the workers are being stopped.
	sigCtx, stopSignals := context.WithCancel(context.Background())
	var g errgroup.Group
	var out Outcome
	g.Go(func() error {
		a.handleSignals(sigCtx, cancel)
		return nil
	})
	g.Go(func() error {
		defer stopSignals()
		var err error
		out, err = a.rounds(ctx)
		return err
	})
	err := g.Wait()
	return out, err
}

// handleSignals turns the first stop signal into cancel, a second into
// kill, and passes SIGUSR1/SIGUSR2 on, until ctx ends.
func (a *Agent) handleSignals(ctx context.Context, cancel context.CancelCauseFunc) {
	stopped := false
	for {
		select {
		case <-ctx.Done():
			return
		case sig := <-a.spec.Signals:
			s, ok := sig.(syscall.Signal)
			switch {
			case !ok:
			case !isStopSignal(s):
				select {
				case a.passOn <- s:
				default:
				}
			case !stopped:
				stopped = true
				cancel(stopSignal{s})
			default:
				a.log.Warn().Str("signal", unix.SignalName(s)).Msg("second stop signal: SIGKILL")
				close(a.kill)
				return
			}
		}
	}
}

// stoppedBy is the signal that stopped ctx: the stop signal, or SIGTERM
// when ctx ended otherwise.
func stoppedBy(ctx context.Context) syscall.Signal {
	var s stopSignal
	if errors.As(context.Cause(ctx), &s) {
		return s.sig
	}
	return syscall.SIGTERM
}

// rounds is the agent's state machine: rendezvous, run, and the ends of a
// round.
func (a *Agent) rounds(ctx context.Context) (Outcome, error) {
	bo := a.spec.NewBackOff()
	var last rendezvous.Round
	for {
		a.transition(StateRendezvous)
		round, err := a.rdzv.Next(ctx)
		var closed *rendezvous.ClosedError
		switch {
		case ctx.Err() != nil:
			return a.stopped(ctx, last), nil
		case errors.As(err, &closed):
			return a.closed(rendezvous.End{Closed: true, Result: closed.Result, Reason: closed.Reason}, last), nil
		case err != nil:
			a.transition(StateFailed)
			return Outcome{ExitCode: 1, Restarts: last.Number}, fmt.Errorf("rendezvous: %w", err)
		}
		last = round
		a.transition(StateRunning, "round", round.Number, "node_rank", round.NodeRank, "nodes", round.NumNodes,
			"world_size", round.WorldSize, "master", fmt.Sprintf("%s:%d", round.MasterAddr, round.MasterPort))
		res, err := a.runRound(ctx, round)
		if err != nil {
			a.transition(StateFailed)
			return Outcome{ExitCode: 1, Restarts: round.Number}, err
		}
		var end rendezvous.End
		switch {
		case ctx.Err() != nil:
			return a.stopped(ctx, round), nil
		case res.requeue:
			a.transition(StateFailed, "reason", "requeue")
			fmt.Fprintf(a.spec.Report, "gorun: the workers saved a checkpoint on request and stopped: exit %d, requeue the job to resume\n", ExitRequeue)
			return Outcome{ExitCode: ExitRequeue, Requeue: true, Restarts: round.Number, Reason: "checkpointed on request"}, nil
		case res.ended != nil:
			end = *res.ended
		case len(res.failures) > 0:
			end, err = a.rdzv.Failed(ctx, round, res.failures)
		default:
			end, err = a.rdzv.Succeeded(ctx, round)
		}
		switch {
		case ctx.Err() != nil:
			return a.stopped(ctx, round), nil
		case err != nil:
			a.transition(StateFailed)
			return Outcome{ExitCode: 1, Restarts: round.Number}, fmt.Errorf("rendezvous: %w", err)
		case end.Err != nil:
			a.transition(StateFailed)
			return Outcome{ExitCode: 1, Restarts: round.Number}, end.Err
		case end.Closed:
			return a.closed(end, round), nil
		}
		a.log.Warn().Int("round", round.Number).Str("reason", end.Reason).Msg("round ended: rejoining")
		if len(res.failures) > 0 {
			select {
			case <-time.After(bo.NextBackOff()):
			case <-ctx.Done():
				return a.stopped(ctx, round), nil
			}
		}
	}
}

// stopped is the outcome of a stop signal (or ctx ending).
func (a *Agent) stopped(ctx context.Context, r rendezvous.Round) Outcome {
	sig := stoppedBy(ctx)
	a.transition(StateFailed, "signal", unix.SignalName(sig))
	return Outcome{ExitCode: 128 + int(sig), Signal: sig, Restarts: r.Number, Reason: context.Cause(ctx).Error()}
}

// closed is the outcome of a job that closed; a failed job's exit code and
// report are its first failure's, whichever node it was on.
func (a *Agent) closed(end rendezvous.End, r rendezvous.Round) Outcome {
	out := Outcome{Restarts: r.Number, Reason: end.Reason}
	if end.Result == rendezvous.ResultSucceeded {
		a.transition(StateSucceeded, "reason", end.Reason)
		return out
	}
	a.transition(StateFailed, "reason", end.Reason)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	failures, err := a.rdzv.Failures(ctx)
	if err != nil {
		a.log.Warn().Err(err).Msg("could not read the job's failures")
	}
	out.Failures, out.ExitCode = failures, 1
	if len(failures) > 0 {
		out.ExitCode = failures[0].ExitCode
		fmt.Fprintf(a.spec.Report, "gorun: job failed: %s\ngorun: first failure: %s\n", end.Reason, failures[0])
	} else {
		fmt.Fprintf(a.spec.Report, "gorun: job failed: %s\n", end.Reason)
	}
	return out
}

// roundResult is how this node's part of a round came out.
type roundResult struct {
	failures []rendezvous.Failure // this node's workers that failed
	ended    *rendezvous.End      // the round ended elsewhere first
	requeue  bool                 // the workers checkpointed on request and stopped
}

// ExitRequeue is the exit status (EX_TEMPFAIL) of a worker that saved a
// checkpoint on request (SIGUSR1/SIGUSR2, SLURM's --signal warning) and
// stopped so the job can be requeued; gorun then exits with it too.
const ExitRequeue = 75

// StackDumpGrace is how long a hung worker gets to print its stacks after
// SIGQUIT before it is killed.
const StackDumpGrace = 3 * time.Second

// worker is one running worker of a round.
type worker struct {
	contract  distenv.Worker
	process   *proc.Process
	logs      *workerlog.Worker
	heartbeat *heartbeat.Pipe // nil without a heartbeat timeout
	hung      atomic.Pointer[heartbeat.Stall]
	suspect   atomic.Bool // hung and found stopped or stuck in the kernel
}

// StallGrace is how long a stalled worker that is not itself stopped waits
// before it is judged: time for the node of a stopped worker to blame it.
const StallGrace = 2 * time.Second

// procState is the one-letter state of process pid ("R", "S", "D", "T",
// ...), or "" when it cannot be read.
func procState(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i > 0 && i+2 < len(s) {
		return s[i+2 : i+3]
	}
	return ""
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

// runRound starts this node's workers for round r and waits until they all
// succeeded, one failed (then the others are stopped), the round ended
// elsewhere, or ctx ended (a stop signal: then all are stopped with it).
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
		}
	}()
	if err != nil {
		a.stopAll(workers, syscall.SIGTERM)
		return roundResult{}, err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	roundEnd := a.rdzv.Watch(watchCtx, r)

	exited := make(chan int, len(workers))
	stalled := make(chan int, 2*len(workers)) // a stall, and its deferral
	for i, w := range workers {
		go func() {
			<-w.process.Done()
			exited <- i
		}()
		if w.heartbeat != nil {
			go func() {
				if stall, ok := <-w.heartbeat.Watch(watchCtx, a.spec.HeartbeatTimeout); ok {
					w.hung.Store(&stall)
					stalled <- i
				}
			}()
		}
	}
	var requeue <-chan time.Time           // set once a worker stopped to be requeued
	deferred := make([]bool, len(workers)) // stalls put off by StallGrace
	for running := len(workers); running > 0; {
		select {
		case i := <-exited:
			running--
			w := workers[i]
			res := w.process.Result()
			if res.Success() {
				a.log.Info().Int("rank", w.contract.Rank).Msg("worker succeeded")
				continue
			}
			if requeue != nil || (res.Signal == 0 && res.ExitCode == ExitRequeue) {
				// The workers agreed on a checkpoint and stop one by one;
				// the rest get TermTimeout to follow.
				if requeue == nil {
					a.log.Warn().Int("rank", w.contract.Rank).Msg("worker checkpointed on request and stopped: requeue")
					requeue = time.After(a.spec.TermTimeout)
				}
				continue
			}
			stopAt := time.Now()
			a.transition(StateStopping, "reason", "worker failed", "rank", w.contract.Rank, "result", res.String())
			a.stopAll(workers, syscall.SIGTERM)
			failures := a.failures(workers, r, stopAt)
			writeFailureTable(a.spec.Report, failures, len(workers)-len(failures))
			return roundResult{failures: failures}, nil
		case <-requeue:
			a.transition(StateStopping, "reason", "requeue: workers still running after the grace period")
			a.stopAll(workers, syscall.SIGTERM)
			return roundResult{requeue: true}, nil
		case end, ok := <-roundEnd:
			if !ok {
				roundEnd = nil // ctx ended; handled below
				continue
			}
			a.transition(StateStopping, "reason", end.Reason)
			a.stopAll(workers, syscall.SIGTERM)
			return roundResult{ended: &end}, nil
		case i := <-stalled:
			// A hung worker holds every other in a collective, so all stop
			// beating together. Blame a worker that is stopped or stuck in
			// the kernel (state T or D) when there is one here; else wait
			// StallGrace for another node to find its culprit first.
			stall := workers[i].hung.Load()
			j := suspectWorker(workers)
			if j < 0 && !deferred[i] {
				deferred[i] = true
				time.AfterFunc(StallGrace, func() { stalled <- i })
				continue
			}
			if j >= 0 {
				i = j
			}
			w := workers[i]
			w.hung.CompareAndSwap(nil, stall)
			if state := procState(w.process.PID()); j >= 0 {
				// A stopped process cannot dump its stacks: kill it now.
				a.log.Warn().Int("rank", w.contract.Rank).Str("state", state).Stringer("stall", w.hung.Load()).Msg("worker hung (stopped or stuck in the kernel): SIGKILL")
				w.suspect.Store(true)
				_ = w.process.Signal(syscall.SIGKILL)
				continue
			}
			a.log.Warn().Int("rank", w.contract.Rank).Stringer("stall", w.hung.Load()).Msg("worker hung: SIGQUIT for a stack dump, then SIGKILL")
			_ = w.process.Signal(syscall.SIGQUIT)
			go func() {
				select {
				case <-w.process.Done():
				case <-time.After(StackDumpGrace):
					_ = w.process.Signal(syscall.SIGKILL)
				}
			}()
		case s := <-a.passOn:
			a.log.Info().Str("signal", unix.SignalName(s)).Msg("passing signal on to workers")
			for _, w := range workers {
				_ = w.process.Signal(s)
			}
		case <-ctx.Done():
			sig := stoppedBy(ctx)
			a.transition(StateStopping, "reason", context.Cause(ctx).Error())
			a.stopAll(workers, sig)
			return roundResult{}, nil
		}
	}
	return roundResult{requeue: requeue != nil}, nil
}

func (a *Agent) startWorkers(sink *workerlog.Sink, r rendezvous.Round) ([]*worker, error) {
	var workers []*worker
	for local := 0; local < a.spec.LocalWorkers; local++ {
		c := a.spec.Contract(r, local)
		logs, err := sink.Worker(c.Rank, c.LocalRank)
		if err != nil {
			return workers, err
		}
		if err := os.MkdirAll(filepath.Dir(c.ErrorFile), 0o755); err != nil {
			logs.Close()
			return workers, fmt.Errorf("error file of rank %d: %w", c.Rank, err)
		}
		_ = os.Remove(c.ErrorFile) // a stale file would name an old error
		spec := proc.Spec{
			Path: a.spec.Command[0], Args: a.spec.Command[1:], Env: c.Environ(a.spec.Environ),
			Stdout: logs.Stdout(), Stderr: logs.Stderr(), Guard: a.spec.Guard,
		}
		var beat *heartbeat.Pipe
		if a.spec.HeartbeatTimeout > 0 {
			if beat, err = heartbeat.NewPipe(); err != nil {
				logs.Close()
				return workers, err
			}
			spec.ExtraFiles = []*os.File{beat.WorkerEnd()}
			spec.Env = append(spec.Env, fmt.Sprintf("%s=%d", heartbeat.EnvVar, heartbeat.WorkerFD))
		}
		p, err := proc.Start(spec)
		if beat != nil {
			_ = beat.CloseWorkerEnd()
		}
		if err != nil {
			logs.Close()
			return workers, fmt.Errorf("start rank %d: %w", c.Rank, err)
		}
		a.workerPIDs.Store(p.PID(), struct{}{})
		a.log.Debug().Int("rank", c.Rank).Int("local_rank", local).Int("pid", p.PID()).Msg("worker started")
		workers = append(workers, &worker{contract: c, process: p, logs: logs, heartbeat: beat})
	}
	return workers, nil
}

// stopAll sends sig to every worker's process group, waits TermTimeout for
// them to end, then kills what is left; a second stop signal kills at
// once. It returns when every worker is reaped.
func (a *Agent) stopAll(workers []*worker, sig syscall.Signal) {
	for _, w := range workers {
		_ = w.process.Signal(sig)
	}
	allDone := make(chan struct{})
	go func() {
		for _, w := range workers {
			<-w.process.Done()
		}
		close(allDone)
	}()
	grace := time.NewTimer(a.spec.TermTimeout)
	defer grace.Stop()
	select {
	case <-allDone:
		return
	case <-grace.C:
		a.log.Warn().Dur("grace", a.spec.TermTimeout).Msg("workers still running after the grace period: SIGKILL")
	case <-a.kill:
	}
	for _, w := range workers {
		_ = w.process.Signal(syscall.SIGKILL)
	}
	<-allDone
}

// failures lists the workers that failed on their own: those that ended
// before stopAt. First failure first.
func (a *Agent) failures(workers []*worker, r rendezvous.Round, stopAt time.Time) []rendezvous.Failure {
	var out []rendezvous.Failure
	for _, w := range workers {
		res := w.process.Result()
		if res.Success() || res.Ended.After(stopAt) {
			continue
		}
		f := rendezvous.Failure{
			Host: a.spec.Host, NodeRank: w.contract.GroupRank, Rank: w.contract.Rank,
			LocalRank: w.contract.LocalRank, PID: res.PID, ExitCode: res.ExitCode,
			Time: res.Ended, Attempt: r.Number,
		}
		if res.Signal != 0 {
			f.Signal = unix.SignalName(res.Signal)
		}
		f.Error = readErrorFile(w.contract.ErrorFile)
		if f.Error == "" {
			f.Error = lastLines(strings.Join(w.logs.Tail(), "\n"), 5)
		}
		if e, ok := a.timedOut.LoadAndDelete(res.PID); ok {
			f.Error = strings.TrimSpace(fmt.Sprintf("watchdog timer %q expired (TORCHELASTIC_TIMER_FILE)\n%s", e.(filetimer.Expiry).Scope, f.Error))
		}
		if stall := w.hung.Load(); stall != nil {
			what := "; stack dump requested (SIGQUIT)"
			if w.suspect.Load() {
				what = "; the process was stopped or stuck in the kernel"
			}
			f.Error = strings.TrimSpace(stall.String() + what + "\n" + f.Error)
		}
		if f.Error == "" {
			f.Error = "(no error file, no stderr output)"
		}
		out = append(out, f)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out
}

func isStopSignal(s syscall.Signal) bool {
	switch s {
	case syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT:
		return true
	}
	return false
}
