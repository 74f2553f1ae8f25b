// Package worker is one worker process of the embedded trainer: `gorun
// worker train.toml`. It reads the torchrun environment contract, trains
// as its rank, saves and resumes checkpoints, stops on the signals the
// agent passes on (checkpointing first when asked), and, under a gorun
// agent, re-forms in place when the agent sends a new round's contract
// on its channel (fd 3) instead of being restarted.
//
// The CLI reads flags and the train.toml, then calls Run once; Run's
// error carries the status the process must exit with.
package worker

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/gorun/gorun/trainer/estimate"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/trainer"
	"github.com/gorun/gorun/trainer/comm"
	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/metrics"
	"github.com/gorun/gorun/trainer/resume"
)

const (
	// ExitUsage is the status of a worker whose environment is wrong (not
	// started by gorun or torchrun, a bad contract or job secret): bad
	// input, as in most Unix tools.
	ExitUsage = 2
	// ExitFailed is the status of a worker whose run failed.
	ExitFailed = 1
	// ExitRequeue is the status of a worker that checkpointed on SIGUSR1
	// or SIGUSR2 and stopped (gorun passes it on as its own with
	// --max-restarts=0): distenv.ExitRequeue, EX_TEMPFAIL of sysexits.h,
	// "try again later": requeue the job and it resumes from that
	// checkpoint.
	ExitRequeue = distenv.ExitRequeue
)

// Options is what one worker process runs with: the train.toml, where
// its environment comes from, and the worker's flags.
type Options struct {
	// Config is the loaded, validated train.toml (see config.Load).
	Config config.Config
	// LookupEnv reads the worker's environment: the torchrun contract
	// (see distenv.FromEnv; WORLD_SIZE=1 without RANK is a world of its
	// own), the agent's channel (heartbeat.EnvVar), whether the worker is
	// a hot spare (heartbeat.StandbyEnvVar), the job secret
	// (jobsecret.EnvVar) and the agent's snapshot directory
	// (snapshot.EnvDir: unset, nothing is saved after each step; set, it
	// must be a directory). nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// Threads is the worker's kernel goroutines; 0 means
	// trainer.DefaultThreads of LOCAL_WORLD_SIZE. It must not be negative.
	Threads int
	// Metrics is the JSON-lines metrics path ("{rank}" gives each rank a
	// file); "" keeps the train.toml's.
	Metrics string
	// Profile times the phases of every step (see trainer.Config.Profile).
	Profile bool
	// DumpParams, when set, is a directory where the worker writes its
	// final parameter slice, as little-endian float32, to rank-N.bin.
	DumpParams string
	// Stdout gets rank 0's lines: the model's description, progress,
	// checkpoints, recoveries and the final line. nil discards them.
	Stdout io.Writer
	// Stderr gets warnings, phase changes between rounds and refused
	// connections. nil discards them.
	Stderr io.Writer
}

// ExitError is every error Run returns: the line to print (Error, which
// names the worker's rank) and the status the process must exit with.
type ExitError struct {
	// Code is the exit status: ExitUsage, ExitFailed, ExitRequeue, or 128
	// plus the number of the signal that stopped the worker (143 for
	// SIGTERM, also when SIGTERM's checkpoint was saved).
	Code int
	// Err is what happened; errors.As reaches the cause through it (a
	// *resume.StoppedError, a *comm.PeerError, ...).
	Err error
}

// Error is the line to print for the worker's end.
func (e *ExitError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *ExitError) Unwrap() error { return e.Err }

// usage is an ExitUsage error with message "worker: <msg>".
func usage(format string, args ...any) *ExitError {
	return &ExitError{Code: ExitUsage, Err: fmt.Errorf("worker: "+format, args...)}
}

// Run trains as the rank opts' environment names until the run ends. With
// the agent's snapshot directory it saves the rank's state there after
// every step, and a worker started for a rank whose previous process
// died offers what that one saved to its peers (see rankSlots). A hot
// spare (heartbeat.StandbyEnvVar=1) first awaits its round's
// contract on the agent's channel. While it trains, Run catches the
// signals the agent passes on (SIGUSR1, SIGUSR2, SIGTERM, SIGINT,
// SIGHUP) for the whole process (os/signal), and stops catching them
// before it returns; likewise it sets the process's GC percent to
// estimate.GCPercent unless GOGC is set, and restores it. ctx ending stops the run
// at once (ExitFailed).
//
// It returns nil once the last step is done (and the checkpoints and
// DumpParams are written). Otherwise it returns an *ExitError: ExitUsage,
// before training, for a wrong environment; ExitRequeue after a
// checkpoint asked by SIGUSR1 or SIGUSR2; 143 after SIGTERM (with or
// without the checkpoint it asks for); 128+n for another signal n that
// stopped it at once; ExitFailed for any other failure, including ctx
// ending (the error is then ctx's cause). Apart from usage errors and
// signals that stop it at once, the error is also written to
// TORCHELASTIC_ERROR_FILE, where the agent looks for it.
func Run(ctx context.Context, opts Options) error {
	lookup := opts.LookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	if opts.Stdout == nil {
		opts.Stdout = io.Discard
	}
	if opts.Stderr == nil {
		opts.Stderr = io.Discard
	}
	if opts.Threads < 0 {
		return usage("Threads = %d: must be 0 (the default) or more", opts.Threads)
	}
	w, err := workerEnv(lookup)
	if err != nil {
		return usage("%w", err)
	}
	if _, set := os.LookupEnv("GOGC"); !set { // the runtime read the process's own
		defer debug.SetGCPercent(debug.SetGCPercent(estimate.GCPercent))
	}
	v, _ := lookup(heartbeat.StandbyEnvVar)
	standby := v == "1"
	if _, channel := lookup(heartbeat.EnvVar); standby && !channel {
		return usage("%s=1 needs the agent's channel (%s): only gorun starts hot spares", heartbeat.StandbyEnvVar, heartbeat.EnvVar)
	}
	secret, err := jobsecret.FromEnv(lookup)
	if err != nil {
		return usage("%w", err)
	}
	snapDir, err := snapshotDir(lookup)
	if err != nil {
		return usage("%w", err)
	}
	if secret.IsZero() && w.WorldSize > 1 && w.Rank == 0 {
		fmt.Fprintf(opts.Stderr, "worker: warning: %s is not set: the ranks of this job do not authenticate each other, and any process that knows its run id can join as a rank (gorun sets one; under torchrun, export one from gorun job-secret)\n", jobsecret.EnvVar)
	}

	sigs, stop := watchSignals(ctx, termSaveTimeout, duplicateSignalWindow)
	defer stop()
	beat := heartbeat.FromEnv(lookup)
	err = run(sigs, opts, beat, w, secret, standby, snapDir)
	xe, lastWords := exitOf(w.Rank, err, sigs.terminated.Load())
	if lastWords {
		writeErrorFile(w.ErrorFile, err)
	}
	if xe != nil && xe.Code == ExitRequeue {
		// The stop may have been asked on another node only: the agent
		// here learns from this line that the exit is a requeue.
		beat.Requeue()
	}
	if xe == nil {
		return nil // not a nil *ExitError in a non-nil error
	}
	return xe
}

// exitOf is how a worker of rank rank ends after its run returned err,
// terminated saying whether a SIGTERM came: nil for nil, else the
// *ExitError Run returns, and whether err goes to the error file (all
// but a signal that stopped the worker at once).
func exitOf(rank int, err error, terminated bool) (xe *ExitError, lastWords bool) {
	var stopped *resume.StoppedError
	var sig signalError
	switch {
	case err == nil:
		return nil, false
	case errors.As(err, &stopped) && stopped.Kind&resume.StopTerminate != 0:
		return &ExitError{Code: 128 + int(syscall.SIGTERM), Err: fmt.Errorf("worker rank %d: stopped by %v: %w", rank, syscall.SIGTERM, err)}, true
	case errors.As(err, &stopped):
		return &ExitError{Code: ExitRequeue, Err: fmt.Errorf("worker rank %d: %w; exit %d asks to be requeued", rank, err, ExitRequeue)}, true
	case errors.As(err, &sig):
		return &ExitError{Code: 128 + int(sig.sig), Err: fmt.Errorf("worker rank %d: %w", rank, err)}, false
	case terminated:
		// SIGTERM came, and the run failed before it could save (a peer already gone).
		return &ExitError{Code: 128 + int(syscall.SIGTERM), Err: fmt.Errorf("worker rank %d: stopped by %v: %w", rank, syscall.SIGTERM, err)}, true
	}
	return &ExitError{Code: ExitFailed, Err: fmt.Errorf("worker rank %d: %w", rank, err)}, true
}

// run trains as rank w, with beat the agent's channel (nil: none) and
// snapDir the agent's snapshot directory ("": none). A hot spare
// (standby: its agent started it before the node had a round) builds its
// trainer for a world of its own, which it never runs, and awaits its
// first round's contract instead.
func run(sigs *workerSignals, opts Options, beat *heartbeat.Beater, w distenv.Worker, secret jobsecret.Secret, standby bool, snapDir string) (err error) {
	ctx := sigs.ctx
	threads := opts.Threads
	who := fmt.Sprintf("worker rank %d", w.Rank)
	if standby {
		who = fmt.Sprintf("hot spare, local rank %d", w.LocalRank)
		// Its threads are those of its place on the node; its world is
		// its own until the round.
		threads = cmp.Or(threads, trainer.DefaultThreads(w.LocalWorldSize))
		w = distenv.Worker{WorldSize: 1, LocalWorldSize: 1, GroupWorldSize: 1, ErrorFile: w.ErrorFile,
			RunID: w.RunID, RoleName: w.RoleName, MaxRestarts: w.MaxRestarts}
	}
	s := &session{ctx: ctx, cfg: opts.Config, worker: w, log: opts.Stdout, warn: opts.Stderr, snapDir: snapDir, stop: &sigs.stop, term: sigs.term, beat: beat,
		follow: beat.Follow(ctx, logPhase(opts.Stderr, who)), waitRound: comm.DefaultTimeout, redone: math.NaN(), stateS: math.NaN()}
	tcfg := trainer.Config{Train: opts.Config, Worker: w, Threads: threads,
		Secret: secret, CommLog: opts.Stderr, Profile: opts.Profile,
		Metrics: opts.Metrics, Log: opts.Stdout, AfterStep: s.afterStep, StopAsked: s.follow.StopAsked}
	if beat != nil {
		// A peer silent past heartbeat.SilentAfter goes to the agent,
		// which checks whether its node can be reached.
		tcfg.SilentAfter, tcfg.OnPeerSilent = heartbeat.SilentAfter, beat.Silent
	}
	s.t, err = trainer.New(ctx, tcfg)
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return err
	}
	defer func() { err = errors.Join(err, s.close()) }()
	if w.Rank == 0 && !standby {
		fmt.Fprintln(opts.Stdout, s.t.Describe())
	}
	// Checkpoints: resume from live peers (a job re-forming around this
	// worker) or the newest valid checkpoint, then save from AfterStep
	// every checkpoint.every steps, at the last step and when a signal
	// asks (sigs.stop).
	begin := s.start
	if standby {
		begin = s.join
	}
	if err := begin(); err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return err
	}
	sigs.saving.Store(true)
	res, err := s.run()
	if err != nil {
		return err
	}
	if s.t.Plan().Rank == 0 {
		fmt.Fprintf(opts.Stdout, "trainer: done: %d steps, last loss %.4f, %.0f tokens/s\n", res.Steps, res.Loss, res.TokensPerS)
	}
	if opts.DumpParams != "" {
		return dumpParams(opts.DumpParams, s.t.Plan().Rank, s.t.State().Params)
	}
	return nil
}

// logPhase logs the round follower's phase changes that a round change
// causes (a phase ended by a new contract, the wait for one and its
// end) to out; the plain start and end of each Run and Reform are not
// worth a line. who names the worker as it started ("worker rank 3").
func logPhase(out io.Writer, who string) func(from, to heartbeat.Phase, why string) {
	return func(from, to heartbeat.Phase, why string) {
		if why == "enter" || why == "leave" {
			return
		}
		fmt.Fprintf(out, "%s: %s -> %s: %s\n", who, from, to, why)
	}
}

// progressOf is the heartbeat of a step's record made in round, with the
// steps redone by the recovery before it (NaN: none to report); an MFU
// of 0 (the trainer knows no peak for its threads) is not reported.
func progressOf(rec metrics.Record, round int, redone float64) heartbeat.Progress {
	p := heartbeat.Progress{Step: rec.Step, Loss: rec.Loss, TokensPerS: rec.TokensPerS, MFU: rec.MFU,
		ComputeS: rec.Compute.Seconds(), Round: float64(round), Redone: redone}
	if rec.MFU == 0 {
		p.MFU = math.NaN()
	}
	return p
}

// workerEnv reads the environment contract; a process with WORLD_SIZE=1
// and no RANK is a world of its own (no MASTER_ADDR needed).
func workerEnv(lookup func(string) (string, bool)) (distenv.Worker, error) {
	_, hasRank := lookup("RANK")
	if ws, ok := lookup("WORLD_SIZE"); !hasRank && ok && strings.TrimSpace(ws) == "1" {
		return distenv.Worker{WorldSize: 1, LocalWorldSize: 1, GroupWorldSize: 1}, nil
	}
	w, err := distenv.FromEnv(lookup)
	if err != nil {
		if !hasRank {
			return w, fmt.Errorf("not started by gorun or torchrun (RANK is not set): run gorun [--nproc-per-node=N] train.toml, or set WORLD_SIZE=1 to train in this process alone")
		}
		return w, err
	}
	return w, nil
}

// writeErrorFile writes err to the worker's TORCHELASTIC_ERROR_FILE in
// torchrun's format, with "lost_peer" naming the peer rank whose loss
// caused it, if any, so the agents can tell a victim from its cause;
// best effort.
func writeErrorFile(path string, err error) {
	if path == "" {
		return
	}
	doc := struct {
		Message  string `json:"message"`
		LostPeer *int   `json:"lost_peer,omitempty"`
	}{Message: err.Error()}
	if pe := (*comm.PeerError)(nil); errors.As(err, &pe) {
		doc.LostPeer = &pe.Rank
	}
	b, jerr := json.Marshal(doc)
	if jerr == nil {
		_ = os.WriteFile(path, b, 0o644)
	}
}

// dumpParams writes params as little-endian float32 to dir/rank-N.bin.
func dumpParams(dir string, rank int, params []float32) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("dump params: %w", err)
	}
	b := make([]byte, 4*len(params))
	for i, p := range params {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(p))
	}
	path := filepath.Join(dir, fmt.Sprintf("rank-%d.bin", rank))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("dump params: %w", err)
	}
	return nil
}
