package main

import (
	"fmt"
	"io"
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
	var (
		m        estimate.Model
		l        estimate.Layout
		p        estimate.Precision
		selected string
		header   []string
		cfg      *config.Config // the train.toml's, if one is given
	)
	sizeFlags := []string{"params", "layers", "hidden", "heads", "seq", "batch", "tp"}
	switch len(args) {
	case 1:
		for _, name := range sizeFlags {
			if c.IsSet(name) {
				return cli.Exit(fmt.Sprintf("estimate: --%s: give a train.toml or the model's sizes, not both", name), exitUsage)
			}
		}
		path := args[0]
		loaded, err := config.Load(path, setsOf(c))
		if err != nil {
			return cli.Exit(err.Error(), exitUsage)
		}
		cfg = &loaded
		nproc := c.Int("nproc-per-node")
		if !c.IsSet("nproc-per-node") {
			nproc = 1
		}
		m, l, selected = estimate.FromConfig(loaded, c.Int("nodes"), nproc)
		p = estimate.FP32()
		mo := cfg.Model
		header = append(header,
			fmt.Sprintf("%s: %d parameters (%d layers, d_model %d, %d heads), micro batch %d x %d bytes, parallel.mode = %s",
				path, mo.Params(), mo.Layers, mo.DModel, mo.Heads, cfg.Train.MicroBatch, mo.Context, cfg.Parallel.Mode),
			"* as the embedded trainer allocates it: fp32 weights (the rank's slice and two gathered units where the mode shards them, whole"+
				" where not), the backward pass's unit buffers, AdamW's moments of the slice, recovery copies (which hold the rank's"+
				" slice of the fp64 gradient sum while the step needs no copy, except across nodes in hsdp, where grads counts it),"+
				" the collectives' buffers (comm) and the process itself (runtime: the Go runtime, the binary's pages and the garbage its collector lets grow, 5 % of the rest);"+
				" other rows: 4 B weights + 4 B gradients + 8 B AdamW per parameter",
			estimate.TrainerCheckpointing(loaded).String())
		if _, err := cfg.Accumulation(l.Nodes * l.ProcPerNode); err != nil {
			header = append(header, "note: "+strings.TrimPrefix(err.Error(), "config: accumulation: "))
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
		m = estimate.Model{Params: c.Float64("params"), Layers: c.Int("layers"), Hidden: c.Int("hidden"),
			Heads: c.Int("heads"), Seq: c.Int("seq"), Batch: c.Int("batch")}
		nproc := c.Int("nproc-per-node")
		if !c.IsSet("nproc-per-node") {
			nproc = 8
		}
		l = estimate.Layout{Nodes: c.Int("nodes"), ProcPerNode: nproc, TP: c.Int("tp")}
		p = estimate.MixedPrecision()
		header = append(header,
			fmt.Sprintf("model: %s parameters, %d layers, hidden %d, %d heads, sequence %d, micro batch %d",
				estimate.FormatCount(m.Params), m.Layers, m.Hidden, m.Heads, m.Seq, m.Batch))
	default:
		return cli.Exit(fmt.Sprintf("estimate: one train.toml at most, got %s", strings.Join(args, " ")), exitUsage)
	}
	if c.IsSet("optimizer-bytes") {
		p.Optimizer = c.Float64("optimizer-bytes")
		if !(p.Optimizer >= 0) {
			return cli.Exit(fmt.Sprintf("estimate: --optimizer-bytes=%g: must be at least 0", p.Optimizer), exitUsage)
		}
	}
	es, err := estimate.Compute(m, l, p)
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	if cfg != nil {
		exact, err := estimate.Trainer(*cfg, l.Nodes, l.ProcPerNode)
		if err != nil {
			return cli.Exit(err.Error(), exitUsage)
		}
		for i := range es {
			if es[i].Strategy == exact.Strategy {
				es[i] = exact
			}
		}
	}
	if c.Bool("json") {
		return estimate.WriteJSON(c.App.Writer, es, selected)
	}
	return writeEstimate(c.App.Writer, header, m, l, p, es, selected)
}

func writeEstimate(w io.Writer, header []string, m estimate.Model, l estimate.Layout, p estimate.Precision,
	es []estimate.Estimate, selected string) error {
	plural := func(n int, one, many string) string {
		if n == 1 {
			return fmt.Sprintf("%d %s", n, one)
		}
		return fmt.Sprintf("%d %s", n, many)
	}
	world := fmt.Sprintf("world: %s x %s = %s", plural(l.Nodes, "node", "nodes"),
		plural(l.ProcPerNode, "process", "processes"), plural(l.Nodes*l.ProcPerNode, "GPU", "GPUs"))
	if l.TP > 1 {
		world += fmt.Sprintf(", tensor parallel %d, data parallel %d", l.TP, l.Nodes*l.ProcPerNode/l.TP)
	}
	lines := append(header, world)
	if selected == "" {
		lines = append(lines, fmt.Sprintf("bytes per parameter: %g weights, %g gradients, %g optimizer state; activations s*b*h*L*(34 + 5*a*s/h)",
			p.Weights, p.Grads, p.Optimizer))
	}
	for _, line := range lines {
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	if _, err := fmt.Fprintln(w); err != nil {
		return err
	}
	if err := estimate.WriteTable(w, es, selected); err != nil {
		return err
	}
	foot := "\nsizes per GPU in decimal units (1 GB = 1e9 bytes), before framework overhead, communication buffers and fragmentation"
	if selected != "" {
		foot = "\nsizes per GPU in decimal units (1 GB = 1e9 bytes); the rows without * are before framework overhead," +
			" communication buffers and fragmentation\n* the strategy the train.toml runs"
	}
	_, err := fmt.Fprintln(w, foot)
	return err
}
