package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/trainer"
	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/metrics"
)

// workerCommand is `gorun worker train.toml`: one rank of the embedded
// trainer. gorun starts it for a .toml entrypoint; torchrun can too
// (torchrun --no-python gorun worker train.toml).
func workerCommand() *cli.Command {
	return &cli.Command{
		Name:      "worker",
		Usage:     "run one rank of the embedded trainer (gorun starts these for a train.toml entrypoint)",
		UsageText: "gorun worker train.toml [--set section.key=value ...] [--metrics PATH] [--threads N]",
		Description: "Reads the torchrun environment contract (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,\n" +
			"MASTER_PORT, ...). Outside gorun or torchrun, WORLD_SIZE=1 alone trains in this process.\n" +
			"Threads default to the CPUs available divided by LOCAL_WORLD_SIZE; OMP_NUM_THREADS is not\n" +
			"read (gorun sets it to 1 for PyTorch's sake).",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "set", Usage: "override a train.toml value: section.key=value (repeatable)"},
			&cli.StringFlag{Name: "metrics", Usage: "JSON-lines metrics file, instead of train.metrics ({rank} gives each rank a file)"},
			&cli.IntFlag{Name: "threads", Usage: "kernel goroutines of this worker", DefaultText: "CPUs / LOCAL_WORLD_SIZE"},
			&cli.StringFlag{Name: "dump-params", Hidden: true, Usage: "write this rank's final parameter slice to DIR/rank-N.bin"},
		},
		Action: workerAction,
	}
}

func workerAction(c *cli.Context) error {
	args, err := parseTrailingFlags(c)
	if err != nil {
		// parseTrailingFlags was written for estimate and says so.
		msg := strings.ReplaceAll(err.Error(), "gorun estimate --help", "gorun worker --help")
		return cli.Exit("worker: "+msg, exitUsage)
	}
	if len(args) != 1 {
		return cli.Exit("worker: give one train.toml: gorun worker train.toml [--set section.key=value ...]", exitUsage)
	}
	cfg, err := config.Load(args[0], c.StringSlice("set"))
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	w, err := workerEnv(os.LookupEnv)
	if err != nil {
		return cli.Exit("worker: "+err.Error(), exitUsage)
	}
	if c.Int("threads") < 0 {
		return cli.Exit(fmt.Sprintf("worker: --threads=%d: must be at least 1", c.Int("threads")), exitUsage)
	}

	ctx, stop := signalContext(c.Context)
	defer stop()
	err = runWorker(ctx, c, cfg, w)
	var sig signalError
	if errors.As(err, &sig) {
		return cli.Exit(fmt.Sprintf("worker rank %d: %v", w.Rank, err), 128+int(sig.sig))
	}
	if err != nil {
		writeErrorFile(w.ErrorFile, err)
		return cli.Exit(fmt.Sprintf("worker rank %d: %v", w.Rank, err), 1)
	}
	return nil
}

func runWorker(ctx context.Context, c *cli.Context, cfg config.Config, w distenv.Worker) (err error) {
	beat := heartbeat.FromEnv(os.LookupEnv) // nil (no-op) unless the agent watches for hangs
	t, err := trainer.New(ctx, trainer.Config{Train: cfg, Worker: w, Threads: c.Int("threads"),
		Metrics: c.String("metrics"), Log: c.App.Writer,
		AfterStep: func(_ *trainer.Trainer, rec metrics.Record) error {
			beat.Beat(rec.Step)
			return nil
		}})
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return err
	}
	defer func() { err = errors.Join(err, t.Close()) }()
	if w.Rank == 0 {
		fmt.Fprintln(c.App.Writer, t.Describe())
	}
	// Checkpoints will hook in here: t.Restore(...) before Run, and
	// t.State() saved from AfterStep every checkpoint.every steps and on
	// SIGUSR1/SIGUSR2.
	res, err := t.Run(ctx)
	if err != nil {
		return err
	}
	if w.Rank == 0 {
		fmt.Fprintf(c.App.Writer, "trainer: done: %d steps, last loss %.4f, %.0f tokens/s\n", res.Steps, res.Loss, res.TokensPerS)
	}
	if dir := c.String("dump-params"); dir != "" {
		return dumpParams(dir, w.Rank, t.State().Params)
	}
	return nil
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

// signalContext returns ctx cancelled, with a signalError cause, by the
// first SIGTERM, SIGINT or SIGHUP (the agent forwards these). SIGUSR1 and
// SIGUSR2 (checkpoint now, once checkpoints exist) are ignored rather than
// left to kill the process.
func signalContext(parent context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	signal.Ignore(syscall.SIGUSR1, syscall.SIGUSR2)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case s := <-sigs:
			cancel(signalError{s.(syscall.Signal)})
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		cancel(nil)
		<-done
	}
}

// writeErrorFile leaves err where the agent looks for a worker's last
// words (TORCHELASTIC_ERROR_FILE, torchrun's format); best effort.
func writeErrorFile(path string, err error) {
	if path == "" {
		return
	}
	b, jerr := json.Marshal(map[string]string{"message": err.Error()})
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
