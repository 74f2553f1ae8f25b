package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/trainer/kernels/gemmbench"
)

// benchGemmCommand is `gorun bench gemm`: the trainer's matrix products
// (fp32, and bf16 where the CPU has AVX512_BF16) in GFLOP/s beside the
// machine's peak for each, measured in one run.
func benchGemmCommand() *cli.Command {
	return &cli.Command{
		Name:  "gemm",
		Usage: "GFLOP/s of the trainer's matrix products (fp32, and bf16 where the CPU runs it) beside the peak",
		Description: "Times kernels.MatMul on square products (--sizes) and the transformer's shapes\n" +
			"(--shapes, MxNxK with an optional :nn/:tn/:nt/:tt for transA/transB) on each thread\n" +
			"count and micro-kernel (--kernels: each ISA the CPU runs, widest first, then the bf16\n" +
			"kernel if the CPU has AVX512_BF16), and a multiply-add loop on registers with that\n" +
			"kernel's instructions (FMA, or VDPBF16PS for bf16) for its peak, each the best of\n" +
			"--runs timings. Every row names the kernel (ISA) and precision it used.\n" +
			"GFLOP/s is by the wall clock only: the products run on the Engine's team of\n" +
			"goroutines, which spin between and within products, so the process's CPU time\n" +
			"counts their waiting as work, and Linux's process clock misses the current time\n" +
			"slice of its other running threads; a rate by CPU time would mean neither what\n" +
			"the cores did nor what the caller got. On a shared machine, raise --runs: the\n" +
			"best timing is the one other load disturbed least.",
		Flags: []cli.Flag{
			&cli.IntSliceFlag{Name: "threads", Value: cli.NewIntSlice(1, 2), Usage: "thread counts to measure"},
			&cli.IntSliceFlag{Name: "sizes", Value: cli.NewIntSlice(256, 1024, 2048), Usage: "square products N³ to measure"},
			&cli.StringSliceFlag{Name: "shapes", Value: cli.NewStringSlice(
				"512x256x64", "512x64x256", "512x256x64:nt", "512x64x256:nt", "256x64x512:tn", "64x256x512:tn",
			), Usage: "other products, MxNxK[:ops] with ops nn, tn, nt or tt"},
			&cli.StringSliceFlag{Name: "kernels", Usage: "micro-kernels to measure (default: every SIMD one this CPU runs, fp32 and bf16, else the portable fp32 one); " +
				"this CPU runs " + strings.Join(gemmbench.AllKernels(), ", ")},
			&cli.IntFlag{Name: "runs", Value: 10, Usage: "timings of each product and of the peak loop; the best counts"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object per measurement instead of a table"},
		},
		Action: benchGemmAction,
	}
}

func benchGemmAction(c *cli.Context) error {
	threads := c.IntSlice("threads")
	runs := c.Int("runs")
	if runs < 1 {
		return cli.Exit(fmt.Sprintf("bench gemm: --runs=%d: want at least 1", runs), exitUsage)
	}
	for _, t := range threads {
		if t < 1 {
			return cli.Exit(fmt.Sprintf("bench gemm: --threads=%d: want at least 1", t), exitUsage)
		}
	}
	var shapes []gemmbench.Shape
	for _, s := range c.IntSlice("sizes") {
		if s < 1 {
			return cli.Exit(fmt.Sprintf("bench gemm: --sizes=%d: want at least 1", s), exitUsage)
		}
		shapes = append(shapes, gemmbench.Shape{M: s, N: s, K: s})
	}
	for _, s := range c.StringSlice("shapes") {
		sh, err := gemmbench.ParseShape(s)
		if err != nil {
			return cli.Exit(fmt.Sprintf("bench gemm: --shapes=%s: %v", s, err), exitUsage)
		}
		shapes = append(shapes, sh)
	}
	kernNames, err := gemmbench.Kernels(c.StringSlice("kernels"))
	if err != nil {
		return cli.Exit(fmt.Sprintf("bench gemm: --kernels=%v", err), exitUsage)
	}

	out := c.App.Writer
	var rows []gemmbench.Row
	var writeErr error
	err = gemmbench.Run(gemmbench.Config{Threads: threads, Shapes: shapes, Kernels: kernNames, Runs: runs}, func(row gemmbench.Row) error {
		rows = append(rows, row)
		if c.Bool("json") {
			if err := json.NewEncoder(out).Encode(row); err != nil {
				writeErr = fmt.Errorf("bench gemm: write: %w", err)
				return writeErr
			}
		}
		return nil
	})
	switch {
	case writeErr != nil:
		return writeErr
	case err != nil:
		return cli.Exit(fmt.Sprintf("bench gemm: %v", err), exitUsage)
	case c.Bool("json"):
		return nil
	}
	return gemmbench.WriteTable(out, rows, runs)
}
