package main

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/trainer"
	"github.com/gorun/gorun/trainer/comm"
	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/metrics"
	"github.com/gorun/gorun/trainer/resume"
)

// workerCommand is `gorun worker train.toml`: one rank of the embedded
// trainer. gorun starts it for a .toml entrypoint; torchrun can too
// (torchrun --no-python gorun worker train.toml).
func workerCommand() *cli.Command {
	return &cli.Command{
		Name:      "worker",
		Usage:     "run one rank of the embedded trainer (gorun starts these for a train.toml entrypoint)",
		UsageText: "gorun worker train.toml [--set section.key=value ...] [--metrics PATH] [--threads N] [--profile]",
		Description: "Reads the torchrun environment contract (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,\n" +
			"MASTER_PORT, ...). Outside gorun or torchrun, WORLD_SIZE=1 alone trains in this process.\n" +
			"Threads default to the CPUs available divided by LOCAL_WORLD_SIZE; OMP_NUM_THREADS is not\n" +
			"read (gorun sets it to 1 for PyTorch's sake).\n\n" +
			"--profile times the phases of every step (gemm, attention, elementwise, optimizer, collectives,\n" +
			"waiting): each metrics record gets a \"profile\" object in seconds, and rank 0 ends with a table of\n" +
			"each phase's share. gorun train.toml --profile passes it to every worker.\n\n" +
			"Checkpoints ([checkpoint] dir, every, keep, async, memory, memory_every): on start every worker resumes from the newest\n" +
			"valid checkpoint in checkpoint.dir (any world size or mode; a corrupt one is skipped for the one\n" +
			"before, and the log says why), and refuses one saved with another model, data, seed, global batch\n" +
			"or optimizer. SIGUSR1 or SIGUSR2 (SLURM's --signal warning, passed on by gorun) makes every worker\n" +
			"save at the next step boundary and exit 75 (EX_TEMPFAIL: checkpointed, requeue me). SIGTERM does\n" +
			"the same if the save can finish within 20 s, then exits 143; otherwise (a peer gone, a slow step)\n" +
			"it exits 143 at once. SIGINT and SIGHUP, or a second SIGTERM (2 s or more after the first: SLURM\n" +
			"delivers one to every process of a step while gorun passes it on too), stop at once.\n\n" +
			"In place: under a gorun agent, when a node is lost or joins, the worker is not restarted: its\n" +
			"world breaks (or the agent's new round arrives between steps), it waits for the new round's\n" +
			"contract on its channel (fd 3), re-forms its groups, takes what its new slice lacks from live\n" +
			"peers (or, with [checkpoint] memory = true, from the buddies' memory copies), and goes on from the\n" +
			"last step every rank completed; only when no live state covers the model does it read a checkpoint.",
		Flags: []cli.Flag{
			setFlag(),
			&cli.StringFlag{Name: "metrics", Usage: "JSON-lines metrics file, instead of train.metrics ({rank} gives each rank a file)"},
			&cli.IntFlag{Name: "threads", Usage: "kernel goroutines of this worker", DefaultText: "CPUs / LOCAL_WORLD_SIZE"},
			&cli.BoolFlag{Name: "profile", Usage: "time the phases of every step into the metrics records and a summary table"},
			&cli.StringFlag{Name: "dump-params", Hidden: true, Usage: "write this rank's final parameter slice to DIR/rank-N.bin"},
		},
		Action: workerAction,
	}
}

func workerAction(c *cli.Context) error {
	args, err := parseTrailingFlags(c)
	if err != nil {
		return cli.Exit("worker: "+err.Error(), exitUsage)
	}
	if len(args) != 1 {
		return cli.Exit("worker: give one train.toml: gorun worker train.toml [--set section.key=value ...]", exitUsage)
	}
	cfg, err := config.Load(args[0], setsOf(c))
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	w, err := workerEnv(os.LookupEnv)
	if err != nil {
		return cli.Exit("worker: "+err.Error(), exitUsage)
	}
	standby := os.Getenv(heartbeat.StandbyEnvVar) == "1"
	if _, channel := os.LookupEnv(heartbeat.EnvVar); standby && !channel {
		return cli.Exit(fmt.Sprintf("worker: %s=1 needs the agent's channel (%s): only gorun starts hot spares", heartbeat.StandbyEnvVar, heartbeat.EnvVar), exitUsage)
	}
	secret, err := jobsecret.FromEnv(os.LookupEnv)
	if err != nil {
		return cli.Exit("worker: "+err.Error(), exitUsage)
	}
	if secret.IsZero() && w.WorldSize > 1 && w.Rank == 0 {
		fmt.Fprintf(c.App.ErrWriter, "worker: warning: %s is not set: the ranks of this job do not authenticate each other, and any process that knows its run id can join as a rank (gorun sets one; under torchrun, export one from gorun job-secret)\n", jobsecret.EnvVar)
	}
	if c.Int("threads") < 0 {
		return cli.Exit(fmt.Sprintf("worker: --threads=%d: must be at least 1", c.Int("threads")), exitUsage)
	}

	sigs, stop := watchSignals(c.Context)
	defer stop()
	err = runWorker(sigs, c, cfg, w, secret, standby)
	var stopped *resume.StoppedError
	var sig signalError
	switch {
	case errors.As(err, &stopped) && stopped.Kind&resume.StopTerminate != 0:
		writeErrorFile(w.ErrorFile, err)
		return cli.Exit(fmt.Sprintf("worker rank %d: stopped by %v: %v", w.Rank, syscall.SIGTERM, err), 128+int(syscall.SIGTERM))
	case errors.As(err, &stopped):
		writeErrorFile(w.ErrorFile, err)
		return cli.Exit(fmt.Sprintf("worker rank %d: %v; exit %d asks to be requeued", w.Rank, err, exitRequeue), exitRequeue)
	case errors.As(err, &sig):
		return cli.Exit(fmt.Sprintf("worker rank %d: %v", w.Rank, err), 128+int(sig.sig))
	case err != nil && sigs.terminated.Load():
		// SIGTERM came, and the run failed before it could save (a peer already gone).
		writeErrorFile(w.ErrorFile, err)
		return cli.Exit(fmt.Sprintf("worker rank %d: stopped by %v: %v", w.Rank, syscall.SIGTERM, err), 128+int(syscall.SIGTERM))
	}
	if err != nil {
		writeErrorFile(w.ErrorFile, err)
		return cli.Exit(fmt.Sprintf("worker rank %d: %v", w.Rank, err), 1)
	}
	return nil
}

// runWorker trains as rank w. A hot spare (standby: its agent started it
// before the node had a round) builds its trainer for a world of its own,
// which it never runs, and awaits its first round's contract instead.
func runWorker(sigs *workerSignals, c *cli.Context, cfg config.Config, w distenv.Worker, secret jobsecret.Secret, standby bool) (err error) {
	ctx := sigs.ctx
	beat := heartbeat.FromEnv(os.LookupEnv) // nil (no-op) unless the agent gave the worker a channel
	threads := c.Int("threads")
	who := fmt.Sprintf("worker rank %d", w.Rank)
	if standby {
		who = fmt.Sprintf("hot spare, local rank %d", w.LocalRank)
		// Its threads are those of its place on the node; its world is
		// its own until the round.
		threads = cmp.Or(threads, trainer.DefaultThreads(w.LocalWorldSize))
		w = distenv.Worker{WorldSize: 1, LocalWorldSize: 1, GroupWorldSize: 1, ErrorFile: w.ErrorFile,
			RunID: w.RunID, RoleName: w.RoleName, MaxRestarts: w.MaxRestarts}
	}
	s := &session{ctx: ctx, cfg: cfg, worker: w, log: c.App.Writer, stop: &sigs.stop, term: sigs.term, beat: beat,
		follow: beat.Follow(ctx, logPhase(c.App.ErrWriter, who)), waitRound: comm.DefaultTimeout, redone: math.NaN()}
	tcfg := trainer.Config{Train: cfg, Worker: w, Threads: threads,
		Secret: secret, CommLog: c.App.ErrWriter, Profile: c.Bool("profile"),
		Metrics: c.String("metrics"), Log: c.App.Writer, AfterStep: s.afterStep, StopAsked: s.follow.StopAsked}
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
		fmt.Fprintln(c.App.Writer, s.t.Describe())
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
		fmt.Fprintf(c.App.Writer, "trainer: done: %d steps, last loss %.4f, %.0f tokens/s\n", res.Steps, res.Loss, res.TokensPerS)
	}
	if dir := c.String("dump-params"); dir != "" {
		return dumpParams(dir, s.t.Plan().Rank, s.t.State().Params)
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

// signalError is the cause of a worker's context when a stop signal came.
type signalError struct{ sig syscall.Signal }

func (e signalError) Error() string { return "stopped by " + e.sig.String() }

const (
	// exitRequeue is the status of a worker that checkpointed on SIGUSR1 or
	// SIGUSR2 and stopped (gorun passes it on as its own with
	// --max-restarts=0): EX_TEMPFAIL of sysexits.h, "try again later":
	// requeue the job and it resumes from that checkpoint.
	exitRequeue = 75
	// termSaveTimeout is how long a SIGTERM waits for the next step
	// boundary and the save there before stopping without one: shorter
	// than gorun's default --term-timeout (30 s), after which gorun kills.
	termSaveTimeout = 20 * time.Second
	// duplicateSignalWindow is how close a second SIGTERM may follow the
	// first and still be the same one delivered twice (by SLURM to every
	// process of the step, and by gorun); a later one stops at once.
	duplicateSignalWindow = 2 * time.Second
)

// workerSignals is what the signals a worker gets have asked for so far.
type workerSignals struct {
	// ctx is cancelled, with a signalError cause, when the worker must
	// stop at once.
	ctx context.Context
	// stop holds the checkpoint-and-stop requests of SIGUSR1, SIGUSR2 and
	// SIGTERM, read at every step boundary.
	stop resume.Stop
	// saving is set once the trainer runs with checkpoints: from then on a
	// SIGTERM asks for a save first instead of stopping at once.
	saving atomic.Bool
	// terminated is set by the first SIGTERM.
	terminated atomic.Bool
	// term is closed by the first SIGTERM that asks for a save: a worker
	// that cannot reach a step boundary (its world broke and it awaits the
	// next round) stops at once instead.
	term chan struct{}
}

// watchSignals starts watching the signals the agent forwards: SIGUSR1
// and SIGUSR2 request a checkpoint and a stop; SIGTERM does too once the
// trainer runs (before that, it stops at once), and cancels ctx if the
// save has not ended the run within termSaveTimeout; SIGINT, SIGHUP and a
// second SIGTERM cancel ctx at once. The returned func stops watching and
// cancels ctx.
func watchSignals(parent context.Context) (*workerSignals, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	ws := &workerSignals{ctx: ctx, term: make(chan struct{})}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var deadline <-chan time.Time
		var firstTerm time.Time
		for {
			select {
			case s := <-sigs:
				sig := s.(syscall.Signal)
				switch {
				case sig == syscall.SIGUSR1 || sig == syscall.SIGUSR2:
					ws.stop.Request(resume.StopRequeue)
				case sig == syscall.SIGTERM && ws.saving.Load() && !ws.terminated.Load():
					ws.terminated.Store(true)
					ws.stop.Request(resume.StopTerminate)
					close(ws.term)
					deadline = time.After(termSaveTimeout)
					firstTerm = time.Now()
				case sig == syscall.SIGTERM && time.Since(firstTerm) < duplicateSignalWindow:
					// The same SIGTERM twice: under SLURM, scancel signals
					// every process of the step, and gorun passes it on too.
				default:
					ws.terminated.Store(ws.terminated.Load() || sig == syscall.SIGTERM)
					cancel(signalError{sig})
				}
			case <-deadline:
				cancel(signalError{syscall.SIGTERM})
			case <-ctx.Done():
				return
			}
		}
	}()
	return ws, func() {
		signal.Stop(sigs)
		cancel(nil)
		<-done
	}
}

// writeErrorFile leaves err where the agent looks for a worker's last
// words (TORCHELASTIC_ERROR_FILE, torchrun's format); best effort.
// writeErrorFile writes err to the worker's TORCHELASTIC_ERROR_FILE in
// torchrun's format, with "lost_peer" naming the peer rank whose loss
// caused it, if any, so the agents can tell a victim from its cause.
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
