package main

import (
	"fmt"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/trainer/metrics"
	"github.com/gorun/gorun/trainer/metrics/chart"
)

// metricsCommand is `gorun metrics`: views of a metrics.jsonl.
func metricsCommand() *cli.Command {
	return &cli.Command{
		Name:  "metrics",
		Usage: "look at a metrics.jsonl the embedded trainer wrote",
		Subcommands: []*cli.Command{
			{
				Name:      "plot",
				Usage:     "draw loss and tokens/s against step, marking restarts and world-size changes, as PNG or SVG",
				UsageText: "gorun metrics plot metrics.jsonl [-o loss.png | -o loss.svg] [--title TEXT]",
				Description: "Draws the job's final line of steps: where a world went back to an earlier step (a resume\n" +
					"from a checkpoint, an in-place recovery that rolled back), the records of the steps it redid\n" +
					"replace those of the world before (the file keeps both, each marked with its round).\n" +
					"Draws the training loss (and the held-out loss, when recorded) on the upper panel and the\n" +
					"whole job's tokens per second on the lower one, against the step. A dashed red line marks\n" +
					"each place where the workers restarted (elapsed_s went back) or the world size changed\n" +
					"(an elastic restart or an in-place recovery), labelled e.g. \"restart, world 2→1\".\n" +
					"The format follows -o's extension: .png (800 x 600 pixels) or .svg.",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "loss.png", Usage: "image to write: NAME.png or NAME.svg"},
					&cli.StringFlag{Name: "title", Usage: "title above the chart", DefaultText: "the metrics file's name, steps and world sizes"},
				},
				Action: metricsPlotAction,
			},
		},
	}
}

func metricsPlotAction(c *cli.Context) error {
	args, err := positionalArgs(c)
	if err != nil {
		return cli.Exit("metrics plot: "+err.Error(), exitUsage)
	}
	if len(args) != 1 {
		return cli.Exit("metrics plot: give one metrics file, e.g. gorun metrics plot metrics.jsonl -o loss.png", exitUsage)
	}
	out := c.String("output")
	if _, err := chart.FormatOf(out); err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	all, err := metrics.ReadFile(args[0])
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	recs := metrics.History(all)
	title := c.String("title")
	if title == "" {
		title = defaultTitle(args[0], recs)
	}
	if err := chart.WriteFile(out, recs, title); err != nil {
		return err
	}
	changes := chart.Changes(recs)
	redone := ""
	if n := len(all) - len(recs); n > 0 {
		redone = fmt.Sprintf(" (%d more in the file: steps a later world redid)", n)
	}
	_, err = fmt.Fprintf(c.App.Writer, "wrote %s: %d records%s, steps %d-%d, %d restarts or world-size changes\n",
		out, len(recs), redone, recs[0].Step, recs[len(recs)-1].Step, len(changes))
	return err
}

// defaultTitle names the file, the steps and the world sizes of recs, e.g.
// "metrics.jsonl: steps 1-300, world 2→1, last loss 2.85".
func defaultTitle(path string, recs []metrics.Record) string {
	first, last := recs[0], recs[len(recs)-1]
	worlds := fmt.Sprint(first.WorldSize)
	for _, ch := range chart.Changes(recs) {
		if ch.From != ch.To {
			worlds += fmt.Sprintf("→%d", ch.To)
		}
	}
	return fmt.Sprintf("%s: steps %d-%d, world %s, last loss %.3g", filepath.Base(path), first.Step, last.Step, worlds, last.Loss)
}
