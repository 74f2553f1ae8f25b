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
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/proc"
	"github.com/gorun/gorun/internal/workerlog"
)

// Spec is what the agent runs on its node.
type Spec struct {
	RunID        string
	Host         string   // the name this node announces; prefixes worker output
	LocalWorkers int      // workers on this node
	Role         string   // ROLE_NAME
	Command      []string // argv of every worker
	Environ      []string // environment the workers inherit under the contract's variables
	VisibleGPUs  []string // CUDA_VISIBLE_DEVICES for the workers; nil leaves it as inherited
	MaxRestarts  int      // restarts after worker failures before the job fails
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
	// Report receives the failure table (gorun's stderr).
	Report io.Writer
	// Signals delivers the signals gorun caught. SIGTERM, SIGINT, SIGHUP
	// and SIGQUIT stop the workers (the same signal, then SIGKILL after
	// TermTimeout; a second one kills at once); SIGUSR1 and SIGUSR2 are
	// passed on to the workers, which keep running.
	Signals <-chan os.Signal
	// NewBackOff gives the delay between restarts; nil is an exponential
	// back-off from 100 ms to 5 s.
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

// Contract is the environment contract of local worker localRank in round
// r at the given restart count.
func (s *Spec) Contract(r Round, localRank, restart int) distenv.Worker {
	rank := r.NodeRank*s.LocalWorkers + localRank
	return distenv.Worker{
		Rank: rank, LocalRank: localRank,
		WorldSize: r.NumNodes * s.LocalWorkers, LocalWorldSize: s.LocalWorkers,
		GroupRank: r.NodeRank, GroupWorldSize: r.NumNodes, RoleName: s.Role,
		MasterAddr: r.MasterAddr, MasterPort: r.MasterPort,
		RestartCount: restart, MaxRestarts: s.MaxRestarts, RunID: s.RunID,
		ErrorFile:   s.errorFile(restart, rank),
		VisibleGPUs: s.VisibleGPUs,
	}
}

func (s *Spec) errorFile(attempt, rank int) string {
	return filepath.Join(s.ErrorDir, fmt.Sprintf("attempt_%d", attempt), fmt.Sprint(rank), "error.json")
}

// Outcome is how the job ended on this node.
type Outcome struct {
	// ExitCode is 0 when every worker succeeded, else the first failure's
	// exit code, or 128+N when signal N stopped the job.
	ExitCode int
	// Failures are the last attempt's failures, first first.
	Failures []WorkerFailure
	Restarts int       // restarts made
	Signal   os.Signal // the signal that stopped the job, if any
}

// Agent runs one node's workers through rounds of a job.
type Agent struct {
	spec  Spec
	rdzv  Rendezvous
	state State
	log   zerolog.Logger
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
	return &Agent{spec: spec, rdzv: rdzv, log: spec.Log.With().Str("component", "agent").Logger()}, nil
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

// Run runs the job until every worker succeeded, the restart budget is
// spent, a stop signal arrived or ctx ended (treated as SIGTERM). It
// returns an error only when the agent itself could not go on (a worker
// could not be started, a log file not created); no worker is left running
// when it returns, whatever the outcome.
func (a *Agent) Run(ctx context.Context) (Outcome, error) {
	bo := a.spec.NewBackOff()
	for restart := 0; ; restart++ {
		a.transition(StateRendezvous, "restart", restart)
		round, err := a.rdzv.Next(ctx, restart)
		if err != nil {
			a.transition(StateFailed)
			return Outcome{ExitCode: 1, Restarts: restart}, fmt.Errorf("rendezvous: %w", err)
		}
		a.transition(StateRunning, "node_rank", round.NodeRank, "nodes", round.NumNodes,
			"world_size", round.NumNodes*a.spec.LocalWorkers, "master", fmt.Sprintf("%s:%d", round.MasterAddr, round.MasterPort))
		res, err := a.runAttempt(ctx, round, restart)
		out := Outcome{ExitCode: res.exitCode(), Failures: res.failures, Restarts: restart, Signal: res.signal}
		switch {
		case err != nil:
			a.transition(StateFailed)
			out.ExitCode = 1
			return out, err
		case res.signal != nil:
			a.transition(StateFailed, "signal", res.signal.String())
			return out, nil
		case len(res.failures) == 0:
			a.transition(StateSucceeded)
			return out, nil
		case restart >= a.spec.MaxRestarts:
			a.transition(StateFailed, "restarts", restart, "max_restarts", a.spec.MaxRestarts)
			return out, nil
		}
		delay := bo.NextBackOff()
		a.log.Warn().Int("restart", restart+1).Int("max_restarts", a.spec.MaxRestarts).Dur("delay", delay).Msg("restarting workers")
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			a.transition(StateFailed)
			return Outcome{ExitCode: 128 + int(syscall.SIGTERM), Restarts: restart, Signal: syscall.SIGTERM, Failures: res.failures}, nil
		case sig := <-a.spec.Signals:
			if s, ok := sig.(syscall.Signal); ok && isStopSignal(s) {
				a.transition(StateFailed, "signal", sig.String())
				return Outcome{ExitCode: 128 + int(s), Restarts: restart, Signal: sig, Failures: res.failures}, nil
			}
		}
	}
}

// attempt is what one attempt came to.
type attempt struct {
	failures []WorkerFailure
	signal   os.Signal
}

func (r attempt) exitCode() int {
	if s, ok := r.signal.(syscall.Signal); ok {
		return 128 + int(s)
	}
	if len(r.failures) > 0 {
		return r.failures[0].ExitCode
	}
	return 0
}

// worker is one running worker of an attempt.
type worker struct {
	contract distenv.Worker
	process  *proc.Process
	logs     *workerlog.Worker
}

// runAttempt starts this node's workers for one round and waits until they
// all succeeded, one failed (then the others are stopped), or a stop
// signal arrived (then all are stopped).
func (a *Agent) runAttempt(ctx context.Context, round Round, restart int) (attempt, error) {
	cfg := a.spec.Logs
	cfg.Host, cfg.RunID, cfg.Attempt = a.spec.Host, a.spec.RunID, restart
	sink, err := workerlog.New(cfg)
	if err != nil {
		return attempt{}, err
	}
	workers, err := a.startWorkers(sink, round, restart)
	defer func() {
		for _, w := range workers {
			w.logs.Close()
		}
	}()
	if err != nil {
		a.stopAll(workers, syscall.SIGTERM)
		return attempt{}, err
	}

	exited := make(chan int, len(workers))
	for i, w := range workers {
		go func() {
			<-w.process.Done()
			exited <- i
		}()
	}
	running := len(workers)
	for running > 0 {
		select {
		case i := <-exited:
			running--
			w := workers[i]
			res := w.process.Result()
			if res.Success() {
				a.log.Info().Int("rank", w.contract.Rank).Msg("worker succeeded")
				continue
			}
			stopAt := time.Now()
			a.transition(StateStopping, "reason", "worker failed", "rank", w.contract.Rank, "result", res.String())
			a.stopAll(workers, syscall.SIGTERM)
			failures := a.failures(workers, restart, stopAt)
			writeFailureTable(a.spec.Report, failures, len(workers)-len(failures))
			return attempt{failures: failures}, nil
		case sig := <-a.spec.Signals:
			s, ok := sig.(syscall.Signal)
			if !ok {
				continue
			}
			if !isStopSignal(s) {
				a.log.Info().Str("signal", unix.SignalName(s)).Msg("passing signal on to workers")
				for _, w := range workers {
					_ = w.process.Signal(s)
				}
				continue
			}
			a.transition(StateStopping, "reason", "signal", "signal", unix.SignalName(s))
			a.stopAll(workers, s)
			return attempt{signal: sig}, nil
		case <-ctx.Done():
			a.transition(StateStopping, "reason", context.Cause(ctx).Error())
			a.stopAll(workers, syscall.SIGTERM)
			return attempt{signal: syscall.SIGTERM}, nil
		}
	}
	return attempt{}, nil
}

func (a *Agent) startWorkers(sink *workerlog.Sink, round Round, restart int) ([]*worker, error) {
	var workers []*worker
	for local := 0; local < a.spec.LocalWorkers; local++ {
		c := a.spec.Contract(round, local, restart)
		logs, err := sink.Worker(c.Rank, c.LocalRank)
		if err != nil {
			return workers, err
		}
		if err := os.MkdirAll(filepath.Dir(c.ErrorFile), 0o755); err != nil {
			logs.Close()
			return workers, fmt.Errorf("error file of rank %d: %w", c.Rank, err)
		}
		_ = os.Remove(c.ErrorFile) // a stale file would name an old error
		p, err := proc.Start(proc.Spec{
			Path: a.spec.Command[0], Args: a.spec.Command[1:], Env: c.Environ(a.spec.Environ),
			Stdout: logs.Stdout(), Stderr: logs.Stderr(), Guard: a.spec.Guard,
		})
		if err != nil {
			logs.Close()
			return workers, fmt.Errorf("start rank %d: %w", c.Rank, err)
		}
		a.log.Debug().Int("rank", c.Rank).Int("local_rank", local).Int("pid", p.PID()).Msg("worker started")
		workers = append(workers, &worker{contract: c, process: p, logs: logs})
	}
	return workers, nil
}

// stopAll sends sig to every worker's process group, waits TermTimeout for
// them to end, then kills what is left. A stop signal arriving meanwhile
// kills at once; other signals are ignored while stopping. It returns when
// every worker is reaped.
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
	for {
		select {
		case <-allDone:
			return
		case <-grace.C:
			a.log.Warn().Dur("grace", a.spec.TermTimeout).Msg("workers still running after the grace period: SIGKILL")
		case s := <-a.spec.Signals:
			if ss, ok := s.(syscall.Signal); !ok || !isStopSignal(ss) {
				continue
			}
			a.log.Warn().Str("signal", s.String()).Msg("second stop signal: SIGKILL")
		}
		for _, w := range workers {
			_ = w.process.Signal(syscall.SIGKILL)
		}
		<-allDone
		return
	}
}

// failures lists the workers that failed on their own: before stopAt, or
// after it with a status other than the stop's. First failure first.
func (a *Agent) failures(workers []*worker, restart int, stopAt time.Time) []WorkerFailure {
	var out []WorkerFailure
	for _, w := range workers {
		res := w.process.Result()
		if res.Success() || res.Ended.After(stopAt) {
			continue
		}
		f := WorkerFailure{
			Host: a.spec.Host, NodeRank: w.contract.GroupRank, Rank: w.contract.Rank,
			LocalRank: w.contract.LocalRank, PID: res.PID, ExitCode: res.ExitCode,
			Time: res.Ended, Attempt: restart,
		}
		if res.Signal != 0 {
			f.Signal = unix.SignalName(res.Signal)
		}
		f.Error = readErrorFile(w.contract.ErrorFile)
		if f.Error == "" {
			f.Error = lastLines(strings.Join(w.logs.Tail(), "\n"), 5)
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
