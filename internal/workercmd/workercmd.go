// Package workercmd is the command line of one rank of the embedded
// trainer, shared by `gorun worker train.toml` and the lean gorun-worker
// binary that a gorun agent starts in its place when it finds one beside
// itself (see launcher's WorkerBinary). Both read the same flags and run
// the same package worker.
package workercmd

import (
	"errors"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/internal/cliflag"
	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/worker"
)

// usageText is the worker's synopsis; %s is the command's name.
const usageText = "%s train.toml [--set section.key=value ...] [--metrics PATH] [--threads N] [--profile]"

// description is the worker's --help text after the synopsis.
const description = "Reads the torchrun environment contract (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,\n" +
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
	"tools linked in: about 20 MB less resident memory a worker) when it lies beside the gorun binary,\n" +
	"and built from the same commit, and `gorun worker` otherwise."

// flags is a fresh set of the worker's flags.
func flags() []cli.Flag {
	return []cli.Flag{
		cliflag.Set(),
		&cli.StringFlag{Name: "metrics", Usage: "JSON-lines metrics file, instead of train.metrics ({rank} gives each rank a file)"},
		&cli.IntFlag{Name: "threads", Usage: "kernel goroutines of this worker", DefaultText: "CPUs / LOCAL_WORLD_SIZE"},
		&cli.BoolFlag{Name: "profile", Usage: "time the phases of every step into the metrics records and a summary table"},
		&cli.StringFlag{Name: "dump-params", Hidden: true, Usage: "write this rank's final parameter slice to DIR/rank-N.bin"},
	}
}

// Command is `gorun worker train.toml`: one rank of the embedded trainer.
// gorun starts it for a .toml entrypoint when no gorun-worker lies beside
// it; torchrun can too (torchrun --no-python gorun worker train.toml).
func Command() *cli.Command {
	return &cli.Command{
		Name:        "worker",
		Usage:       "run one rank of the embedded trainer (gorun starts these for a train.toml entrypoint)",
		UsageText:   fmt.Sprintf(usageText, "gorun worker"),
		Description: description,
		Flags:       flags(),
		Action:      action,
	}
}

// App is the gorun-worker binary: Command's flags and action as a program
// of its own (gorun-worker train.toml ...), which links the trainer and
// not the rest of gorun.
func App() *cli.App {
	return &cli.App{
		Name:            "gorun-worker",
		Usage:           "one rank of gorun's embedded trainer (gorun starts it for a train.toml entrypoint)",
		UsageText:       fmt.Sprintf(usageText, "gorun-worker"),
		Description:     description,
		Flags:           flags(),
		Action:          action,
		HideHelpCommand: true,
	}
}

// action checks the train.toml and the flags, then
// runs the worker (package worker), whose error carries the exit status.
func action(c *cli.Context) error {
	name := c.Command.HelpName
	args, err := cliflag.ParseTrailing(c)
	if err != nil {
		return cli.Exit(name+": "+err.Error(), worker.ExitUsage)
	}
	if len(args) != 1 {
		return cli.Exit(fmt.Sprintf("%s: give one train.toml: %s train.toml [--set section.key=value ...]", name, name), worker.ExitUsage)
	}
	cfg, err := config.Load(args[0], cliflag.Sets(c))
	if err != nil {
		return cli.Exit(err.Error(), worker.ExitUsage)
	}
	if c.Int("threads") < 0 {
		return cli.Exit(fmt.Sprintf("%s: --threads=%d: must be at least 1", name, c.Int("threads")), worker.ExitUsage)
	}
	err = worker.Run(c.Context, worker.Options{
		Config: cfg, LookupEnv: os.LookupEnv, Threads: c.Int("threads"), Metrics: c.String("metrics"),
		Profile: c.Bool("profile"), DumpParams: c.String("dump-params"), Stdout: c.App.Writer, Stderr: c.App.ErrWriter,
	})
	var exit *worker.ExitError
	if errors.As(err, &exit) {
		return cli.Exit(exit.Error(), exit.Code)
	}
	return err
}
