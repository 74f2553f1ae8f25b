package main

import (
	"errors"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/cmd/internal/workercmd"
	"github.com/gorun/gorun/trainer/worker"
)

// workerCommand is `gorun worker train.toml`: one rank of the embedded
// trainer (package workercmd reads its flags, as gorun-worker's). gorun
// starts it for a .toml entrypoint when no gorun-worker lies beside it;
// torchrun can too (torchrun --no-python gorun worker train.toml).
func workerCommand() *cli.Command {
	return &cli.Command{
		Name:            "worker",
		Usage:           "run one rank of the embedded trainer (gorun starts these for a train.toml entrypoint)",
		UsageText:       "gorun worker " + workercmd.Usage,
		Description:     workercmd.Description,
		SkipFlagParsing: true, // workercmd parses them, --help included
		Action: func(c *cli.Context) error {
			err := workercmd.Run(c.Context, "gorun worker", c.Args().Slice(), c.App.Writer, c.App.ErrWriter)
			var exit *worker.ExitError
			if errors.As(err, &exit) {
				return cli.Exit(exit.Error(), exit.Code)
			}
			return err
		},
	}
}
