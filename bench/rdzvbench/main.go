package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// usage lists the subcommands.
const usage = `usage: rdzvbench COMMAND [flags]

commands:
  ports     print two consecutive free TCP ports of 127.0.0.1 (P and P+1), the first one only
  serve     run an embedded etcd on 127.0.0.1 until SIGTERM/SIGINT; writes its endpoint to -endpoint-file
  rounds    round time of N in-process agents (goroutines, one etcd client each), events per agent, etcd cost
  agentloss node loss among N in-process agents: kill to every other agent's round end and next round
  nodeloss  kill -9 of one of 3 gorun agents to all workers of the next round started
  job       a 2 nodes x 2 workers job under gorun (etcd, static) and torchrun (c10d), side by side;
            and (-workloads wide) N nodes x 1 worker under gorun etcd beside torchrun c10d
  sweep     kill every process whose environment holds -marker (leftovers)

Run "rdzvbench COMMAND -h" for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:]))
}

// run dispatches to a subcommand and maps its error to an exit status.
func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// Stop (SIGTERM: clean up, then exit) when the script that started
	// this dies, however it dies.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGTERM), 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "rdzvbench: prctl PR_SET_PDEATHSIG: %v\n", err)
		return 1
	}
	cmds := map[string]func(context.Context, []string) error{
		"ports":     portsCmd,
		"serve":     serveCmd,
		"rounds":    roundsCmd,
		"nodeloss":  nodeLossCmd,
		"agentloss": agentLossCmd,
		"job":       jobCmd,
		"sweep":     sweepCmd,
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "rdzvbench: unknown command %q\n%s", args[0], usage)
		return 2
	}
	if err := cmd(ctx, args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(os.Stderr, "rdzvbench %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// newFlags returns a flag set for command name that reports errors
// instead of exiting.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("rdzvbench "+name, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	return fs
}
