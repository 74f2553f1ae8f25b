package main

import "github.com/urfave/cli/v2"

// benchCommand groups the benchmarks that print a table with the anchor
// (gloo, the machine's FMA peak, ...) measured beside ours in one run.
func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure gorun's parts beside their anchors, in one run",
		Subcommands: []*cli.Command{
			benchGemmCommand(),
			benchCommCommand(),
		},
	}
}
