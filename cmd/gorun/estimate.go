package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/estimate"
)

// estimateCommand is `gorun estimate`: per-GPU memory of a train.toml, or
// of a model given by its sizes, under DDP, ZeRO-1/2/3 and HSDP.
func estimateCommand() *cli.Command {
	return &cli.Command{
		Name:  "estimate",
		Usage: "predict per-GPU memory for DDP, ZeRO-1, ZeRO-2, ZeRO-3/FSDP and HSDP",
		UsageText: "gorun estimate train.toml [--nodes N --nproc-per-node P] [--set section.key=value ...]\n" +
			"gorun estimate --params 7e9 --layers L --hidden H --heads A --seq S --batch B [--tp T] [--optimizer-bytes K] [--nodes N --nproc-per-node P]",
		Description: "Splits each GPU's memory into parameters, gradients, optimizer state and activations, with the\n" +
			"ZeRO paper's mixed-precision accounting (2 bytes/param weights, 2 gradients, K = 12 optimizer\n" +
			"bytes for AdamW's fp32 master copy and two moments) and activations s*b*h*L*(34 + 5*a*s/h)\n" +
			"bytes (Korthikanti et al.), divided by the tensor-parallel degree. For a train.toml: the\n" +
			"strategies in fp32 (4 + 4 + 8 bytes/param), and the row of the strategy it runs (*) as the\n" +
			"embedded trainer allocates it: whole fp32 weights, fp32 and fp64 gradient sums, AdamW's\n" +
			"moments of the rank's slice, its recovery copies (rollback, [checkpoint] memory and async),\n" +
			"its activation buffers, the buffers of its collectives and the process's own memory\n" +
			"(runtime), and what train.activation_checkpointing trades: the activations of one block\n" +
			"instead of all of them, for a recomputation in the backward pass (its FLOPs are printed).\n" +
			"Decimal units; the other rows are before framework overhead, communication buffers and\n" +
			"fragmentation.",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "nodes", Value: 1, Usage: "nodes N"},
			&cli.IntFlag{Name: "nproc-per-node", Aliases: []string{"nproc_per_node"}, Usage: "GPUs (processes) per node P", DefaultText: "1 for a train.toml, else 8"},
			setFlag(),
			&cli.Float64Flag{Name: "params", Usage: "parameter count, e.g. 7e9"},
			&cli.IntFlag{Name: "layers", Usage: "transformer layers L"},
			&cli.IntFlag{Name: "hidden", Usage: "hidden size h"},
			&cli.IntFlag{Name: "heads", Usage: "attention heads a"},
			&cli.IntFlag{Name: "seq", Usage: "sequence length s"},
			&cli.IntFlag{Name: "batch", Usage: "micro batch per GPU b"},
			&cli.IntFlag{Name: "tp", Value: 1, Usage: "tensor-parallel degree T"},
			&cli.Float64Flag{Name: "optimizer-bytes", Aliases: []string{"optimizer_bytes"}, Usage: "optimizer bytes per parameter K", DefaultText: "12, or 8 for a train.toml"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object per strategy, one a line"},
		},
		Action: estimateAction,
	}
}

func estimateAction(c *cli.Context) error {
	args, err := positionalArgs(c)
	if err != nil {
		return cli.Exit("estimate: "+err.Error(), exitUsage)
	}
	var optimizer *float64
	if c.IsSet("optimizer-bytes") {
		k := c.Float64("optimizer-bytes")
		if !(k >= 0) {
			return cli.Exit(fmt.Sprintf("estimate: --optimizer-bytes=%g: must be at least 0", k), exitUsage)
		}
		optimizer = &k
	}
	sizeFlags := []string{"params", "layers", "hidden", "heads", "seq", "batch", "tp"}
	var r estimate.Report
	switch len(args) {
	case 1:
		for _, name := range sizeFlags {
			if c.IsSet(name) {
				return cli.Exit(fmt.Sprintf("estimate: --%s: give a train.toml or the model's sizes, not both", name), exitUsage)
			}
		}
		cfg, err := config.Load(args[0], setsOf(c))
		if err != nil {
			return cli.Exit(err.Error(), exitUsage)
		}
		nproc := c.Int("nproc-per-node")
		if !c.IsSet("nproc-per-node") {
			nproc = 1
		}
		r, err = estimate.ForConfig(args[0], cfg, c.Int("nodes"), nproc, optimizer)
		if err != nil {
			return cli.Exit(err.Error(), exitUsage)
		}
	case 0:
		var missing []string
		for _, name := range sizeFlags[:6] {
			if !c.IsSet(name) {
				missing = append(missing, "--"+name)
			}
		}
		if len(missing) > 0 {
			return cli.Exit(fmt.Sprintf("estimate: missing %s (give a train.toml, or --params --layers --hidden --heads --seq --batch)", strings.Join(missing, ", ")), exitUsage)
		}
		if len(setsOf(c)) > 0 {
			return cli.Exit("estimate: --set needs a train.toml", exitUsage)
		}
		nproc := c.Int("nproc-per-node")
		if !c.IsSet("nproc-per-node") {
			nproc = 8
		}
		m := estimate.Model{Params: c.Float64("params"), Layers: c.Int("layers"), Hidden: c.Int("hidden"),
			Heads: c.Int("heads"), Seq: c.Int("seq"), Batch: c.Int("batch")}
		r, err = estimate.ForModel(m, estimate.Layout{Nodes: c.Int("nodes"), ProcPerNode: nproc, TP: c.Int("tp")}, optimizer)
		if err != nil {
			return cli.Exit(err.Error(), exitUsage)
		}
	default:
		return cli.Exit(fmt.Sprintf("estimate: one train.toml at most, got %s", strings.Join(args, " ")), exitUsage)
	}
	if c.Bool("json") {
		return r.WriteJSON(c.App.Writer)
	}
	return r.WriteText(c.App.Writer)
}
