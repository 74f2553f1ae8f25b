// Command gorun-worker is one rank of gorun's embedded trainer, the same
// program as `gorun worker` without gorun's launcher, embedded etcd and
// tools linked in. A gorun agent starts it, for a train.toml entrypoint,
// when it lies in the agent's own directory (go build -o bin/ ./cmd/gorun
// ./cmd/gorun-worker) and was built from the same commit.
//
// Why a binary of its own: every package a Go binary links runs its init
// and so brings its code and data into the process's resident set. gorun's
// 300 packages (etcd, gRPC, protobuf, Prometheus, plots) cost each worker
// about 28 MB of the binary's pages; this binary's, about 6 MB. The page
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

	"github.com/gorun/gorun/cmd/internal/workercmd"
	"github.com/gorun/gorun/trainer/worker"
)

func main() {
	err := workercmd.Run(context.Background(), "gorun-worker", os.Args[1:], os.Stdout, os.Stderr)
	if err == nil {
		os.Exit(0)
	}
	// The same line as gorun worker's, for the agent's log.
	fmt.Fprintf(os.Stderr, "gorun: %s\n", err)
	var exit *worker.ExitError
	if errors.As(err, &exit) {
		os.Exit(exit.Code)
	}
	os.Exit(1)
}
