package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/launcher"
)

// sbatchCommand is `gorun sbatch`: print a SLURM batch script that runs
// one gorun per node under srun.
func sbatchCommand() *cli.Command {
	// The flags write into spec: aliases then share one value, also when
	// positionalArgs sets a flag given after the entrypoint.
	spec := &launcher.Sbatch{}
	env := &envList{}
	return &cli.Command{
		Name:  "sbatch",
		Usage: "print a SLURM batch script that runs ENTRYPOINT with one gorun per node",
		UsageText: "gorun sbatch ENTRYPOINT --nodes N (--gpus-per-node G | --nproc-per-node P) --time T\n" +
			"    [--min-nodes M] [--partition P] [--job-name J] [--output DIR] [--metrics-port PORT] [--gorun PATH] [--env K=V ...]\n" +
			"    [-- more gorun flags] > job.sbatch\n" +
			"sbatch job.sbatch [ENTRYPOINT args...]",
		Description: "The script asks for N nodes with one task each, --requeue, --no-kill (the job outlives a\n" +
			"dead node) and SIGUSR1 120 s before the time limit (gorun passes it on to the workers), and\n" +
			"runs srun --no-kill --kill-on-bad-exit=0 GORUN --nproc-per-node=... ENTRYPOINT \"$@\", so the\n" +
			"script's arguments reach the entrypoint. GORUN is this binary's absolute path unless --gorun.\n" +
			"--min-nodes M makes the job elastic: gorun --nnodes=M:N --max-restarts=N-M goes on with the\n" +
			"nodes left.",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "nodes", Destination: &spec.Nodes, Aliases: []string{"N"}, Usage: "nodes N"},
			&cli.IntFlag{Name: "min-nodes", Destination: &spec.MinNodes, Aliases: []string{"min_nodes"}, Usage: "go on down to M nodes when nodes are lost (gorun --nnodes=M:N)"},
			&cli.IntFlag{Name: "gpus-per-node", Destination: &spec.GPUsPerNode, Aliases: []string{"gpus_per_node"}, Usage: "GPUs per node G, one worker each"},
			&cli.StringFlag{Name: "nproc-per-node", Destination: &spec.NProcPerNode, Aliases: []string{"nproc_per_node"}, Usage: "workers per node P (N, auto or cpu) when there are no GPUs"},
			&cli.StringFlag{Name: "time", Destination: &spec.Time, Aliases: []string{"t"}, Usage: "time limit T: minutes, M:S, H:M:S, D-H, D-H:M or D-H:M:S"},
			&cli.StringFlag{Name: "partition", Destination: &spec.Partition, Aliases: []string{"p"}, Usage: "partition (default: the cluster's)"},
			&cli.StringFlag{Name: "job-name", Destination: &spec.JobName, Aliases: []string{"job_name", "J"}, Usage: "job name (default: the entrypoint's name)"},
			&cli.StringFlag{Name: "output", Destination: &spec.OutputDir, Aliases: []string{"o"}, Usage: "directory of the job's output file %x-%j.out (default: where sbatch runs)"},
			&cli.IntFlag{Name: "max-restarts", Destination: &spec.MaxRestarts, Aliases: []string{"max_restarts"}, Value: -1, Usage: "gorun --max-restarts", DefaultText: "with --min-nodes M, N-M: a dying node's peers often fail before it is noticed as gone"},
			&cli.IntFlag{Name: "metrics-port", Destination: &spec.MetricsPort, Aliases: []string{"metrics_port"}, Usage: "every node's gorun serves Prometheus metrics at http://NODE:PORT/metrics (--metrics-addr=0.0.0.0:PORT)"},
			&cli.StringFlag{Name: "gorun", Destination: &spec.Gorun, Usage: "gorun binary on the nodes (default: this binary's absolute path)"},
			&cli.GenericFlag{Name: "env", Value: env, Usage: "export K=V in the script before srun (repeatable)"},
		},
		Action: func(c *cli.Context) error { return sbatchAction(c, spec, env) },
	}
}

// envList is a repeatable K=V flag that, unlike a string slice flag,
// keeps commas in values.
type envList []string

func (e *envList) Set(v string) error { *e = append(*e, v); return nil }
func (e *envList) String() string     { return strings.Join(*e, " ") }

func sbatchAction(c *cli.Context, spec *launcher.Sbatch, env *envList) error {
	raw := c.Args().Slice()
	var extra []string
	if i := slices.Index(raw, "--"); i >= 0 {
		extra = slices.Clone(raw[i+1:])
	}
	args, err := positionalArgs(c)
	if err != nil {
		return cli.Exit("sbatch: "+err.Error(), exitUsage)
	}
	positional := args[:len(args)-len(extra)]
	switch {
	case len(positional) == 0:
		return cli.Exit("sbatch: no entrypoint: gorun sbatch train.toml|script.py --nodes N --nproc-per-node P --time T", exitUsage)
	case len(positional) > 1:
		return cli.Exit(fmt.Sprintf("sbatch: one entrypoint, got %q; put more gorun flags after --, and the entrypoint's arguments after sbatch job.sbatch", positional), exitUsage)
	}
	spec.Entrypoint, spec.GorunFlags, spec.Env = positional[0], extra, *env
	spec.RenderedBy = renderedBy(*spec)
	if c.IsSet("gpus-per-node") && spec.GPUsPerNode < 1 {
		return cli.Exit(fmt.Sprintf("sbatch: --gpus-per-node=%d: want 1 or more", spec.GPUsPerNode), exitUsage)
	}
	if c.IsSet("min-nodes") && spec.MinNodes < 1 {
		return cli.Exit(fmt.Sprintf("sbatch: --min-nodes=%d: want 1 or more", spec.MinNodes), exitUsage)
	}
	if spec.Gorun == "" {
		self, err := os.Executable()
		if err != nil {
			return cli.Exit(fmt.Sprintf("sbatch: find this gorun binary (give --gorun PATH): %v", err), 1)
		}
		if spec.Gorun, err = filepath.Abs(self); err != nil {
			return cli.Exit(fmt.Sprintf("sbatch: find this gorun binary (give --gorun PATH): %v", err), 1)
		}
	}
	if err := spec.Validate(); err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	if err := checkEntrypoint(spec.Entrypoint); err != nil {
		return cli.Exit("sbatch: "+err.Error(), exitUsage)
	}
	if spec.OutputDir != "" {
		if info, err := os.Stat(spec.OutputDir); err != nil || !info.IsDir() {
			fmt.Fprintf(c.App.ErrWriter, "gorun sbatch: note: create --output %s before sbatch: SLURM does not, and a job whose output it cannot open fails without a word\n", spec.OutputDir)
		}
	}
	script, err := spec.Render()
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	_, err = fmt.Fprint(c.App.Writer, script)
	return err
}

// checkEntrypoint wants a .py or .toml entrypoint, or a path, to be a
// file here; another name is a program that must be on PATH.
func checkEntrypoint(entry string) error {
	if !strings.HasSuffix(entry, ".py") && !strings.HasSuffix(entry, ".toml") && !strings.Contains(entry, "/") {
		if _, err := exec.LookPath(entry); err != nil {
			return fmt.Errorf("entrypoint %s: not a file here, nor a program on PATH", entry)
		}
		return nil
	}
	info, err := os.Stat(entry)
	if err != nil {
		return fmt.Errorf("entrypoint %s: %w", entry, unwrapPath(err))
	}
	if info.IsDir() {
		return fmt.Errorf("entrypoint %s is a directory", entry)
	}
	return nil
}

// renderedBy is the gorun sbatch command line that renders spec (its
// flags in a fixed order), for the script's header.
func renderedBy(s launcher.Sbatch) string {
	args := []string{"gorun", "sbatch", s.Entrypoint, "--nodes", strconv.Itoa(s.Nodes)}
	add := func(flag, v string) {
		if v != "" && v != "0" {
			args = append(args, flag, v)
		}
	}
	add("--min-nodes", strconv.Itoa(s.MinNodes))
	add("--gpus-per-node", strconv.Itoa(s.GPUsPerNode))
	add("--nproc-per-node", s.NProcPerNode)
	add("--time", s.Time)
	add("--partition", s.Partition)
	add("--job-name", s.JobName)
	add("--output", s.OutputDir)
	if s.MaxRestarts >= 0 {
		args = append(args, "--max-restarts", strconv.Itoa(s.MaxRestarts))
	}
	add("--metrics-port", strconv.Itoa(s.MetricsPort))
	add("--gorun", s.Gorun)
	for _, kv := range s.Env {
		add("--env", kv)
	}
	if len(s.GorunFlags) > 0 {
		args = append(append(args, "--"), s.GorunFlags...)
	}
	for i, a := range args {
		args[i] = launcher.ShellQuote(a)
	}
	return strings.Join(args, " ")
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
