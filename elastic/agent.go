package elastic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
	"github.com/gorun/gorun/internal/proc"
	"github.com/gorun/gorun/internal/workerlog"
	"github.com/gorun/gorun/rendezvous"
)

// Rendezvous forms the rounds of a job and decides, across nodes, how each
// ends. rendezvous.Static and *rendezvous.Elastic implement it.
type Rendezvous interface {
	// Next blocks until this node's next round runs.
	Next(ctx context.Context) (rendezvous.Round, error)
	// RunsWithout says whether the job runs a round without this node,
	// so that Next would have it wait (a spare, a replacement): its
	// workers can start meanwhile.
	RunsWithout(ctx context.Context) bool
	// Watch sends one End when round r is over for a reason that is not
	// this node's own (another node failed or left, the job closed).
	Watch(ctx context.Context, r rendezvous.Round) <-chan rendezvous.End
	// Blame records failures of r at once, before the agent acts on them
	// (kills a hung worker), so that what the action breaks is reported
	// after them. It does not end r.
	Blame(ctx context.Context, r rendezvous.Round, failures []rendezvous.Failure) error
	// Stalled says this node's workers stopped making progress in r with
	// no culprit here, and blocks until r ends elsewhere (false) or this
	// node is the one to name a culprit among its own workers (true).
	Stalled(ctx context.Context, r rendezvous.Round) (bool, error)
	// Unreachable checks whether the node holding global rank `rank` of r
	// can be reached, a worker here having heard nothing from it, and
	// reports it when not: the rendezvous then leaves one side of the
	// fault out of the next round.
	Unreachable(ctx context.Context, r rendezvous.Round, rank int) error
	// Connected says whether this node can hear of a round change now
	// (its session with the rendezvous is live).
	Connected() bool
	// Reform ends r for a world that broke with no node lost, opening a
	// round of the same members (a membership change), or does nothing
	// when r is over already.
	Reform(ctx context.Context, r rendezvous.Round, reason string) error
	// Failed reports this node's worker failures in r and says how r ends:
	// a restart, or the job closed as failed.
	Failed(ctx context.Context, r rendezvous.Round, failures []rendezvous.Failure) (rendezvous.End, error)
	// FailedInPlace is Failed for failures the agent recovers from by
	// restarting the failed workers alone: the next round, if the budget
	// allows, keeps every other worker of the job in place (End.InPlace).
	FailedInPlace(ctx context.Context, r rendezvous.Round, failures []rendezvous.Failure) (rendezvous.End, error)
	// Abandon records the agent's own failure f (it cannot go on) and ends
	// the job for every node.
	Abandon(ctx context.Context, f rendezvous.Failure) error
	// Succeeded reports that this node's workers succeeded in r and waits
	// until the job closed or a new round opened.
	Succeeded(ctx context.Context, r rendezvous.Round) (rendezvous.End, error)
	// Failures returns every failure reported in the job, first first.
	Failures(ctx context.Context) ([]rendezvous.Failure, error)
	// Exchange is an all-gather among the nodes of round r: every node's
	// value in node-rank order, once all put theirs
	// (rendezvous.ErrRoundEnded when r ends first;
	// rendezvous.ErrNoExchange where nodes share no store).
	Exchange(ctx context.Context, r rendezvous.Round, value []byte) ([][]byte, error)
	// RecordRecovery keeps an in-place recovery for gorun status; the
	// agent of node rank 0 of the new round calls it once per recovery.
	RecordRecovery(ctx context.Context, rec rendezvous.Recovery) error
}

// Spec is what the agent runs on its node.
type Spec struct {
	RunID        string
	Host         string   // the name this node announces; prefixes worker output
	LocalWorkers int      // workers on this node
	Role         string   // ROLE_NAME
	Command      []string // argv of every worker
	Environ      []string // environment the workers inherit under the contract's variables
	// WorkerGPUs is, per local rank, the CUDA_VISIBLE_DEVICES of that
	// worker (torchrun's --virtual-local-rank); nil, or a nil entry,
	// leaves the inherited value.
	WorkerGPUs [][]string
	// VirtualLocalRank gives every worker LOCAL_RANK=0 (torchrun's
	// --virtual-local-rank).
	VirtualLocalRank bool
	// WorkerCPUs is, per local rank, the CPU affinity the worker starts
	// with (--numa-binding); nil, or a nil entry, inherits gorun's.
	WorkerCPUs [][]int
	// Stdin is the workers' standard input, shared by all of them as
	// under torchrun (gorun's own, so that pdb works in a worker); nil
	// gives them /dev/null.
	Stdin       *os.File
	MaxRestarts int // TORCHELASTIC_MAX_RESTARTS (the budget itself is the rendezvous's)
	// TermTimeout is the grace between the stop signal and SIGKILL. It is
	// also how long a worker that succeeded leaves its own background
	// children (an uploader) to finish before they are killed.
	TermTimeout time.Duration
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
	// NewBackOff gives the delays before rejoining after workers that keep
	// failing within HealthyAfter of their start (a first failure restarts
	// at once); nil is an exponential back-off from 100 ms to 5 s.
	NewBackOff func() backoff.BackOff
	// Observer, when not nil, is told of the agent's states, rounds,
	// restarts and workers (metrics). With one, every worker gets a
	// heartbeat pipe, also without a HeartbeatTimeout.
	Observer Observer
	// InPlace keeps the workers across a round change that only changed
	// the membership (a node lost, or one joining: rendezvous.End.Cause
	// is CauseMembership) when every local worker is alive: they get
	// their contract in the new round over their heartbeat channel
	// instead of a restart. A worker failure, a hang or a closed job
	// stop them all as without it. For workers that speak the channel
	// (the embedded trainer), never for scripts.
	InPlace bool
	// AwaitTimeout bounds how long a worker that said it awaits a new
	// round (an await line: its world broke) waits for one: then it is
	// reported as failed. 0 is DefaultAwaitTimeout; the launcher gives
	// the lease TTL plus the join timeout, the longest a round change
	// may take.
	AwaitTimeout time.Duration
	// ReformAfter, when positive and InPlace, is how long a worker awaits
	// a new round before the agent asks for one itself (Rendezvous.Reform):
	// a world that broke while no node's lease expired (a one-way or
	// partial network fault) re-forms in place with the same members
	// instead of waiting out AwaitTimeout and restarting from a checkpoint.
	// Each further re-form before the workers make progress again waits
	// twice as long (at most 32 times), sparing the membership-change
	// budget during a long fault. The launcher gives twice the lease TTL:
	// by then a node that is really gone has lost its lease.
	ReformAfter time.Duration
	// Snapshots, when not nil, is the workers' snapshot directory: before
	// a round's fresh script workers start, the agents agree on the step
	// they restore and give it to them (see Snapshots).
	Snapshots *Snapshots
	// Warm, when not nil, is the command of a warm worker (Python's:
	// python/gorun/_warm.py before the script and its arguments): the
	// agent keeps one per local rank started ahead of the next round,
	// which loads what the worker spends its start on (import torch) and
	// waits on its channel; a round's worker is then a warm one given its
	// environment (heartbeat.ExecLine) instead of a fresh process. Not
	// with InPlace.
	Warm []string
	// WarmDelay bounds how long after a round's workers started the agent
	// waits to start the next warm ones: it starts them at this node's
	// first snapshot in the round (its first step, for a script that
	// saves with the gorun package), so that their imports do not compete
	// with the workers' own start, or after WarmDelay if none came.
	// Before each rendezvous they start at once.
	WarmDelay time.Duration
	Log       zerolog.Logger
}

// DefaultAwaitTimeout is Spec.AwaitTimeout when it is 0.
const DefaultAwaitTimeout = 2 * time.Minute

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
	case len(s.WorkerGPUs) > s.LocalWorkers || len(s.WorkerCPUs) > s.LocalWorkers:
		return fmt.Errorf("elastic: GPUs or CPUs for more than %d local workers", s.LocalWorkers)
	case s.AwaitTimeout < 0:
		return fmt.Errorf("elastic: await timeout %s < 0", s.AwaitTimeout)
	case s.Warm != nil && s.InPlace:
		return errors.New("elastic: warm workers are for workers restarted by a round, not kept in place")
	}
	return nil
}

// Contract is the environment contract of local worker localRank in round r.
func (s *Spec) Contract(r rendezvous.Round, localRank int) distenv.Worker {
	rank := r.FirstRank + localRank
	var gpus []string
	if localRank < len(s.WorkerGPUs) {
		gpus = s.WorkerGPUs[localRank]
	}
	return distenv.Worker{
		Rank: rank, LocalRank: localRank,
		WorldSize: r.WorldSize, LocalWorldSize: s.LocalWorkers,
		GroupRank: r.NodeRank, GroupWorldSize: r.NumNodes, RoleName: s.Role,
		MasterAddr: r.MasterAddr, MasterPort: r.MasterPort,
		RestartCount: r.Number, MaxRestarts: s.MaxRestarts, RunID: s.RunID,
		ErrorFile:   filepath.Join(s.ErrorDir, fmt.Sprintf("attempt_%d", r.Number), fmt.Sprint(rank), "error.json"),
		VisibleGPUs: gpus, VirtualLocalRank: s.VirtualLocalRank,
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

	kill     chan struct{} // closed at a second stop signal
	passOn   chan syscall.Signal
	observed bool // spec.Observer was given: workers report progress to it

	// signalled is set once gorun passed a signal to the workers (SIGUSR1
	// or SIGUSR2, SLURM's warning) or stopped them for one: only then, or
	// when the worker said so on its channel (heartbeat.Pipe.Requeued),
	// does a worker's ExitRequeue mean "checkpointed on request, requeue";
	// otherwise it is a failure like any other exit status.
	signalled atomic.Bool

	workerPIDs sync.Map // pid -> struct{}: this round's workers, for the timer server
	timedOut   sync.Map // pid -> filetimer.Expiry: workers whose watchdog timer expired

	// Worker events, for the monitor of whichever round runs: they
	// outlive a round when the workers are kept in place.
	// reforms counts the re-forms this agent asked for since its workers
	// last made progress in a new round (Spec.ReformAfter's back-off).
	reforms atomic.Int32

	exits   chan *worker    // a worker's process ended
	awaits  chan *worker    // a worker awaits a new round
	silent  chan silence    // a worker heard nothing from a peer for heartbeat.SilentAfter
	resumed chan resumption // a kept worker's first progress in its new round

	// warm is, by local rank, the warm worker started ahead of the next
	// round (Spec.Warm), or nil: the round loop's alone.
	warm []*worker
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
	if spec.AwaitTimeout == 0 {
		spec.AwaitTimeout = DefaultAwaitTimeout
	}
	observed := spec.Observer != nil
	if !observed {
		spec.Observer = nopObserver{}
	}
	return &Agent{
		spec: spec, observed: observed, rdzv: rdzv, log: spec.Log.With().Str("component", "agent").Logger(),
		kill: make(chan struct{}), passOn: make(chan syscall.Signal, 4),
		exits: make(chan *worker), awaits: make(chan *worker, 4*spec.LocalWorkers),
		silent:  make(chan silence, 4*spec.LocalWorkers),
		resumed: make(chan resumption, spec.LocalWorkers),
		warm:    make([]*worker, spec.LocalWorkers),
	}, nil
}

// State is the agent's current state; only meaningful from Run's goroutine.
func (a *Agent) State() State { return a.state }

// transition moves the agent to state to, logging the edge with fields.
// It refuses an edge that is not in the transition table (a bug): the
// agent stays where it is, and the caller acts on the error returned.
func (a *Agent) transition(to State, fields ...any) error {
	if err := checkTransition(a.state, to); err != nil {
		return err
	}
	ev := a.log.Info().Stringer("from", a.state).Stringer("to", to)
	if len(fields) > 0 {
		ev = ev.Fields(fields)
	}
	ev.Msg("agent state")
	a.spec.Observer.StateChanged(a.state, to)
	a.state = to
	return nil
}

// stopSignal is the cause of Run's context when a stop signal arrived.
type stopSignal struct{ sig syscall.Signal }

func (s stopSignal) Error() string { return "stopped by " + unix.SignalName(s.sig) }

// Run runs the job until it closes (every node's workers succeeded, or
// a budget is spent), a stop signal arrives, or ctx ends (as SIGTERM). It
// returns an error only when the agent itself could not go on (a worker
// could not be started, the rendezvous failed, a state edge outside the
// transition table, a bug, was refused); no worker is left running
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
				a.signalled.Store(true)
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

// abandonTimeout bounds how long an agent that cannot go on tries to tell
// the other nodes so.
const abandonTimeout = 10 * time.Second

// rounds is the agent's life: passes of rendezvous, a round and its end,
// until the job closes, a stop signal comes or the agent itself fails.
// decide says after each pass where the agent goes.
func (a *Agent) rounds(ctx context.Context) (Outcome, error) {
	l := &life{pacer: newRestartPacer(a.spec.NewBackOff())}
	defer a.dropWarm()
	defer a.dropKept(ctx, l)
	for {
		if err := a.transition(StateRendezvous); err != nil {
			return a.abandon(l.last, err)
		}
		out := a.pass(ctx, l)
		to, err := decide(a.state, out)
		if err != nil {
			return a.abandon(l.last, err)
		}
		if to != StateRendezvous {
			return a.end(ctx, to, out, l)
		}
	}
}

// life is what the agent's round loop carries from one pass to the next.
type life struct {
	last   rendezvous.Round // the last round this node ran in (ranOne), else none
	ranOne bool
	kept   *keep // workers going on in place into the next round, or nil
	pacer  *restartPacer
}

// dropKept stops the workers still kept when the agent's life ends (the
// job ended while the round changed, or while this node waited as a hot
// spare): with the stop signal, or SIGTERM.
func (a *Agent) dropKept(ctx context.Context, l *life) {
	if l.kept == nil {
		return
	}
	sig := syscall.SIGTERM
	if ctx.Err() != nil {
		sig = stoppedBy(ctx)
	}
	why := "the job ended while the round changed"
	if l.kept.kind == keepSpare {
		why = "the job ended while this node waited as a hot spare"
	}
	a.discard(l.kept.workers, sig, why)
}

// pass is one pass of the agent's life from StateRendezvous: it waits for
// a round (as a hot spare when the job runs without this node), runs this
// node's part of it with the workers kept from the round before or fresh
// ones, and settles how it ended with the rendezvous. l.kept is what goes
// on into the next round after it.
func (a *Agent) pass(ctx context.Context, l *life) outcome {
	joined := time.Now()
	if l.kept == nil {
		l.kept = a.standby(ctx)
		a.warmUp() // their imports overlap the rendezvous
	}
	round, out := a.join(ctx, l.kept == nil || l.kept.kind == keepSpare)
	if out != nil {
		return out
	}
	a.spec.Observer.RoundStarted(round, time.Since(joined))
	workers, recovering := a.takeOver(ctx, l.last, round, l.kept)
	switch {
	case workers != nil && recovering == nil:
		a.log.Info().Int("round", round.Number).Msg("taken in with its workers started and ready (hot spare): they take their state from their peers")
	case workers != nil:
		a.spec.Observer.RecoveredInPlace(round, len(recovering.end.Lost))
	case l.ranOne:
		a.spec.Observer.Restarted(restartOf(l.last, round))
	}
	l.kept, l.last, l.ranOne = nil, round, true
	if err := a.transition(StateRunning, "round", round.Number, "node_rank", round.NodeRank, "nodes", round.NumNodes,
		"world_size", round.WorldSize, "master", fmt.Sprintf("%s:%d", round.MasterAddr, round.MasterPort),
		"in_place", recovering != nil); err != nil {
		if workers != nil {
			a.discard(workers, syscall.SIGTERM, err.Error())
		}
		return broken{err}
	}
	started := time.Now()
	out, err := a.runRound(ctx, round, workers, recovering)
	l.kept = keptBy(out) // until the rendezvous says whether they go on
	if err != nil {
		return broken{err}
	}
	out = a.settle(ctx, round, out)
	next, ok := out.(rejoin)
	if !ok {
		return out
	}
	l.kept = next.keep
	if next.afterFailure {
		select {
		case <-time.After(l.pacer.Delay(time.Since(started))):
		case <-ctx.Done():
			return stopped{stoppedBy(ctx)}
		}
	}
	return out
}

// join is Rendezvous.Next (see next): the round this node runs next, or,
// with no round, how waiting for one ended.
func (a *Agent) join(ctx context.Context, idle bool) (rendezvous.Round, outcome) {
	round, sig, err := a.next(ctx, idle)
	var closedErr *rendezvous.ClosedError
	var evictedErr *rendezvous.EvictedError
	switch {
	case ctx.Err() != nil:
		return round, stopped{stoppedBy(ctx)}
	case sig != 0:
		// SLURM's warning before the job's end: nothing here to save.
		return round, requeue{idle: sig}
	case errors.As(err, &closedErr) && closedErr.Result == rendezvous.ResultSucceeded:
		// Only a round that this node did not run in can close while
		// it waits to join one: the job went on without it.
		return round, leftOut{closedErr}
	case errors.As(err, &closedErr):
		return round, closed{rendezvous.End{Closed: true, Result: closedErr.Result, Reason: closedErr.Reason}}
	case errors.As(err, &evictedErr):
		return round, evicted{evictedErr.Reason}
	case err != nil:
		return round, broken{err}
	}
	return round, nil
}

// settle turns how this node's part of round r came out into how r ends
// for the job, reporting it to the rendezvous: success, failures (paced
// before the next round), a worker restarted alone (whose keep goes on
// only when the rendezvous grants it: End.InPlace), or an end the
// rendezvous already gave. An outcome that ends the agent (a stop, a
// requeue) is returned as it is.
func (a *Agent) settle(ctx context.Context, r rendezvous.Round, out outcome) outcome {
	if ctx.Err() != nil {
		return stopped{stoppedBy(ctx)}
	}
	var end rendezvous.End
	var err error
	var k *keep
	switch o := out.(type) {
	case succeeded:
		end, err = a.rdzv.Succeeded(ctx, r)
	case failed:
		end, err = a.rdzv.Failed(ctx, r, o.failures)
	case respawn:
		k = o.keep
		end, err = a.rdzv.FailedInPlace(ctx, r, []rendezvous.Failure{o.failure})
		k.end = end
	case reform:
		end, k = o.end, o.keep
	case ended:
		end = o.end
	default:
		return out
	}
	switch {
	case ctx.Err() != nil:
		return stopped{stoppedBy(ctx)}
	case err != nil:
		return broken{err}
	case end.Closed:
		return closed{end}
	}
	a.log.Warn().Int("round", r.Number).Str("reason", end.Reason).Msg("round ended: rejoining")
	if o, ok := a.spec.Observer.(EndObserver); ok {
		o.RoundEnded(end)
	}
	if k != nil && !keptAcross(end) {
		// This node kept its workers to restart one alone, and the job
		// restarts them all instead (a static world, or the round ended
		// another way first).
		a.discard(k.workers, syscall.SIGTERM, "the next round restarts every worker")
		k = nil
	}
	_, isFailed := out.(failed)
	_, isRespawn := out.(respawn)
	return rejoin{end: end, keep: k, afterFailure: isFailed || isRespawn}
}

// next is Rendezvous.Next. An agent with no workers (idle: a spare, or
// one whose workers stopped) that gets SIGUSR1 or SIGUSR2 meanwhile (the
// warning SLURM sends before a job's end, for a checkpoint and a
// requeue) stops waiting and returns that signal: it has nothing to
// save, and waiting on would hold the job's end. With workers kept in
// place, the signal waits for the next round's monitor, which passes it
// on; so does one that arrives as Next returns.
func (a *Agent) next(ctx context.Context, idle bool) (rendezvous.Round, syscall.Signal, error) {
	if !idle {
		r, err := a.rdzv.Next(ctx)
		return r, 0, err
	}
	nctx, cancel := context.WithCancel(ctx)
	got := make(chan syscall.Signal, 1)
	go func() {
		defer close(got)
		select {
		case s := <-a.passOn:
			got <- s
			cancel()
		case <-nctx.Done():
		}
	}()
	r, err := a.rdzv.Next(nctx)
	cancel()
	s, ok := <-got
	switch {
	case !ok:
		return r, 0, err
	case err == nil:
		select {
		case a.passOn <- s: // a round came first: its monitor passes the signal on
		default: // the same signal is waiting there already
		}
		return r, 0, nil
	case ctx.Err() != nil:
		return r, 0, err
	}
	return rendezvous.Round{}, s, nil
}

// takeOver hands the workers k kept (nil: none) from round from to round
// r. It returns r's workers, told their new contracts (adopt), and k as
// where they came from, for the record of the recovery (nil for a hot
// spare's: taking them in is no recovery of this node's); or nothing,
// after stopping them, when they could not be handed over: then fresh
// workers start, as after any restart.
func (a *Agent) takeOver(ctx context.Context, from, r rendezvous.Round, k *keep) ([]*worker, *keep) {
	if k == nil {
		return nil, nil
	}
	ran := &from
	if k.kind == keepSpare {
		ran = nil
	}
	workers, err := a.adopt(ctx, ran, r, k)
	if err != nil {
		a.discard(workers, syscall.SIGTERM, err.Error())
		return nil, nil
	}
	if k.kind == keepSpare {
		return workers, nil
	}
	return workers, k
}

// end ends the agent's life in state to (StateSucceeded or StateFailed,
// as decide said) for out, and returns the node's Outcome: with an error
// only when the agent itself broke.
func (a *Agent) end(ctx context.Context, to State, out outcome, l *life) (Outcome, error) {
	r := l.last
	res := Outcome{Restarts: r.Number}
	if l.ranOne && endsUnfinished(out) {
		a.dropKept(ctx, l)
		l.kept = nil
		a.persistLast(r)
	}
	switch o := out.(type) {
	case closed:
		return a.closed(to, o.end, r)
	case broken:
		return a.abandon(r, o.err)
	case stopped:
		res.ExitCode, res.Signal, res.Reason = 128+int(o.sig), o.sig, context.Cause(ctx).Error()
		return res, a.finish(to, "", "signal", unix.SignalName(o.sig))
	case requeue:
		res.ExitCode, res.Requeue = ExitRequeue, true
		if o.idle == 0 {
			res.Reason = "checkpointed on request"
			return res, a.finish(to, fmt.Sprintf("the workers saved a checkpoint on request and stopped: exit %d, requeue the job to resume", ExitRequeue),
				"reason", "requeue")
		}
		res.Reason = fmt.Sprintf("%s while waiting for a round, with no workers to checkpoint", unix.SignalName(o.idle))
		return res, a.finish(to, fmt.Sprintf("%s: exit %d, requeue the job to resume", res.Reason, ExitRequeue),
			"reason", "requeue", "signal", unix.SignalName(o.idle))
	case evicted:
		// The job goes on without this node: its end is not the job's.
		res.ExitCode, res.Reason = 1, o.reason
		return res, a.finish(to, o.reason+"; the job goes on without it", "reason", o.reason)
	case leftOut:
		// No round took this node after its last one, or none at all: it
		// was counted lost, or came too late, and its workers had no part
		// in the job's end. The node failed, and says so.
		why := "no round of the job took it"
		if l.ranOne {
			why = fmt.Sprintf("no round took it after round %d, the last it ran in (it was counted lost, or joined too late)", r.Number)
		}
		res.ExitCode = 1
		res.Reason = fmt.Sprintf("the job succeeded without node %s: %s; the job: %s", a.spec.Host, why, o.err.Reason)
		return res, a.finish(to, res.Reason, "reason", res.Reason)
	}
	return a.abandon(r, fmt.Errorf("elastic: no end for outcome %T", out))
}

// endsUnfinished reports whether out ends the job on this node before its
// workers succeeded, so that a later run goes on from where it stopped: a
// stop signal, a requeue, or the job closed as failed.
func endsUnfinished(out outcome) bool {
	switch o := out.(type) {
	case stopped, requeue:
		return true
	case closed:
		return o.end.Result != rendezvous.ResultSucceeded
	}
	return false
}

// finish moves the agent to its last state to with fields, and reports
// line (when not empty) on the report.
func (a *Agent) finish(to State, line string, fields ...any) error {
	if err := a.transition(to, fields...); err != nil {
		return err
	}
	if line != "" {
		fmt.Fprintf(a.spec.Report, "gorun: %s\n", line)
	}
	return nil
}

// abandon ends the agent for its own error err after it joined the job:
// it records err as this node's failure, which ends the job on every
// other node at once, and returns err.
func (a *Agent) abandon(r rendezvous.Round, err error) (Outcome, error) {
	if terr := a.transition(StateFailed, "error", err.Error()); terr != nil {
		err = errors.Join(err, terr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
	defer cancel()
	f := rendezvous.Failure{Host: a.spec.Host, ExitCode: 1, Time: time.Now(), Attempt: r.Number, Error: err.Error()}
	if aerr := a.rdzv.Abandon(ctx, f); aerr != nil {
		a.log.Warn().Err(aerr).Msg("could not tell the other nodes that this agent failed")
	}
	return Outcome{ExitCode: 1, Restarts: r.Number, Reason: err.Error()}, err
}

// closed is the outcome of a job that closed, ending the agent in state
// to; a failed job's exit code and report are its first failure's,
// whichever node it was on.
func (a *Agent) closed(to State, end rendezvous.End, r rendezvous.Round) (Outcome, error) {
	out := Outcome{Restarts: r.Number, Reason: end.Reason}
	if err := a.transition(to, "reason", end.Reason); err != nil {
		return out, err
	}
	if end.Result == rendezvous.ResultSucceeded {
		return out, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	failures, err := a.rdzv.Failures(ctx)
	if err != nil {
		a.log.Warn().Err(err).Msg("could not read the job's failures")
	}
	out.Failures, out.ExitCode = failures, 1
	if len(failures) > 0 {
		out.ExitCode = failures[0].ExitCode
		fmt.Fprintf(a.spec.Report, "gorun: job failed: %s\ngorun: first failure: %s\n", firstLine(end.Reason), failures[0])
	} else {
		fmt.Fprintf(a.spec.Report, "gorun: job failed: %s\n", firstLine(end.Reason))
	}
	return out, nil
}

// ExitRequeue is the exit status (distenv.ExitRequeue) of a worker that
// saved a checkpoint on request (SIGUSR1/SIGUSR2, SLURM's --signal
// warning) and stopped so the job can be requeued; gorun then exits with
// it too. It means that only after gorun passed such a signal (or a stop
// signal) to the workers, or when the worker said so on its channel
// before it exited (its peers elsewhere were signalled first): a worker
// that exits 75 unasked has failed, as under torchrun.
const ExitRequeue = distenv.ExitRequeue

func isStopSignal(s syscall.Signal) bool {
	switch s {
	case syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT:
		return true
	}
	return false
}
