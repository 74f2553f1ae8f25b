// Package workercmd is the command line of one rank of the embedded
// trainer, shared by `gorun worker train.toml` and the lean gorun-worker
// binary that a gorun agent starts in its place when it finds one beside
// itself (see launcher.WorkerBinary). Both read the same flags and run the
// same package worker. It parses with the standard library's flag package:
// gorun-worker links nothing it does not run (see cmd/gorun-worker).
package workercmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/worker"
)

// Usage is the worker's synopsis less its name.
const Usage = "train.toml [--set section.key=value ...] [--metrics PATH] [--threads N] [--profile]"

// Description is the worker's --help text after the synopsis.
const Description = "Reads the torchrun environment contract (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,\n" +
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
	"last step every rank completed; only when no live state covers the model does it read a checkpoint.\n\n" +
	"gorun runs the lean gorun-worker binary (the same command without gorun's launcher, etcd and\n" +
	"tools linked in: about 20 MB less resident memory a worker) when it lies beside the gorun binary\n" +
	"and was built from the same commit, and `gorun worker` otherwise."

// options are the worker's flags.
type options struct {
	metrics    string
	threads    int
	profile    bool
	dumpParams string
}

// Run is one rank of the embedded trainer, from its command line: args
// are what follows name (name is "gorun worker" or "gorun-worker", which
// messages and --help use), flags before or after the train.toml. It reads
// the train.toml, runs package worker until it ends or ctx is done (which
// stops the worker as SIGINT would), and returns nil on success, nil after
// printing --help to stdout, and otherwise a *worker.ExitError with the
// exit status (worker.ExitUsage for a bad command line or train.toml).
// The trainer's progress goes to stdout, its warnings to stderr.
func Run(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs, opts := flagSet(name)
	// The flag package stops at the first argument that is not a flag;
	// SplitArgs takes the train.toml and the --sets out from among them.
	toml, sets, rest, err := config.SplitArgs(args, func(name string) bool {
		f := fs.Lookup(name)
		return f != nil && !isBool(f)
	})
	if err != nil {
		return usageError(name, err)
	}
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(stdout, name, fs)
			return nil
		}
		return usageError(name, err)
	}
	if toml == "" || fs.NArg() > 0 {
		return &worker.ExitError{Code: worker.ExitUsage, Err: fmt.Errorf("%s: give one train.toml: %s %s", name, name, Usage)}
	}
	cfg, err := config.Load(toml, sets)
	if err != nil {
		return &worker.ExitError{Code: worker.ExitUsage, Err: err}
	}
	if opts.threads < 0 {
		return &worker.ExitError{Code: worker.ExitUsage, Err: fmt.Errorf("%s: --threads=%d: must be at least 1", name, opts.threads)}
	}
	return worker.Run(ctx, worker.Options{
		Config: cfg, LookupEnv: os.LookupEnv, Threads: opts.threads, Metrics: opts.metrics,
		Profile: opts.profile, DumpParams: opts.dumpParams, Stdout: stdout, Stderr: stderr,
	})
}

// flagSet is the worker's flags, parsed into the options it returns.
func flagSet(name string) (*flag.FlagSet, *options) {
	opts := &options{}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, --help printed by printHelp
	// SplitArgs takes every --set out before the flag set parses the rest;
	// the flag is here for --help.
	fs.Func("set", "override a train.toml value: section.key=value (repeatable; a TOML value, commas and all)", func(string) error { return nil })
	fs.StringVar(&opts.metrics, "metrics", "", "JSON-lines metrics file, instead of train.metrics ({rank} gives each rank a file)")
	fs.IntVar(&opts.threads, "threads", 0, "kernel goroutines of this worker (default: CPUs / LOCAL_WORLD_SIZE)")
	fs.BoolVar(&opts.profile, "profile", false, "time the phases of every step into the metrics records and a summary table")
	fs.StringVar(&opts.dumpParams, "dump-params", "", "") // tests: this rank's final parameter slice to DIR/rank-N.bin
	return fs, opts
}

// usageError is a flag package error in the words of gorun's other
// commands: "unknown flag --x (NAME --help lists the flags)".
func usageError(name string, err error) error {
	msg := err.Error()
	if flagName, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		msg = fmt.Sprintf("unknown flag --%s (%s --help lists the flags)", strings.TrimLeft(flagName, "-"), name)
	}
	return &worker.ExitError{Code: worker.ExitUsage, Err: fmt.Errorf("%s: %s", name, msg)}
}

// printHelp writes the synopsis, the description and the flags (all but
// the hidden --dump-params) to w.
func printHelp(w io.Writer, name string, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: %s %s\n\n%s\n\nflags (before or after the train.toml):\n", name, Usage, Description)
	fs.VisitAll(func(f *flag.Flag) {
		if f.Usage == "" {
			return
		}
		arg := " VALUE"
		if isBool(f) {
			arg = ""
		}
		fmt.Fprintf(w, "  --%s%s\n      %s\n", f.Name, arg, f.Usage)
	})
}

// isBool is whether f is a boolean flag, which takes no value.
func isBool(f *flag.Flag) bool {
	bf, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && bf.IsBoolFlag()
}
