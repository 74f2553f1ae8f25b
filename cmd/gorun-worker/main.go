// Command gorun-worker is one rank of gorun's embedded trainer, the same
// program as `gorun worker` without gorun's launcher, embedded etcd and
// tools linked in. A gorun agent starts it, for a train.toml entrypoint,
// when it lies in the agent's own directory (go build -o bin/ ./cmd/gorun
// ./cmd/gorun-worker).
//
// Why a binary of its own: every package a Go binary links runs its init
// and so brings its code and data into the process's resident set. gorun's
// 300 packages (etcd, gRPC, protobuf, Prometheus, plots) cost each worker
// about 28 MB of the binary's pages; this binary's, about 7 MB. The page
// cache shares those pages among a node's processes, but a worker's
// resident set (what SLURM's accounting, sacct's MaxRSS and ps report)
// counts them, and at 8 workers a rank's slice of the model is not much
// more.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/internal/workercmd"
)

func main() {
	app := workercmd.App()
	err := app.RunContext(context.Background(), os.Args)
	if err == nil {
		os.Exit(0)
	}
	code := 1
	var coder cli.ExitCoder
	if errors.As(err, &coder) {
		code = coder.ExitCode()
	}
	if msg := strings.TrimSpace(err.Error()); msg != "" {
		fmt.Fprintf(app.ErrWriter, "gorun: %s\n", msg)
	}
	os.Exit(code)
}
