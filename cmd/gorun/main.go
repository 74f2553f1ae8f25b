// Command gorun is a SLURM-native, torchrun-compatible launcher: one gorun
// per node starts, watches and restarts the node's training workers.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"
)

func main() {
	// Recovery timings are read off the logs: keep sub-second precision.
	zerolog.TimeFieldFormat = "2006-01-02T15:04:05.000Z07:00"
	app := NewApp()
	os.Exit(exitCode(app, runApp(context.Background(), app, os.Args)))
}

// exitCode maps Run's error to gorun's exit status, printing the error on
// one line: a *cli.ExitError carries its own code, anything else is 1.
func exitCode(app *cli.App, err error) int {
	if err == nil {
		return 0
	}
	code := 1
	var coder cli.ExitCoder
	if errors.As(err, &coder) {
		code = coder.ExitCode()
	}
	if msg := strings.TrimSpace(err.Error()); msg != "" {
		fmt.Fprintf(app.ErrWriter, "gorun: %s\n", msg)
	}
	return code
}
