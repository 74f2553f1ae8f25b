package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/trainer/kernels"
)

// gemmShape is one product of `gorun bench gemm`: op(A) m×k times op(B) k×n.
type gemmShape struct {
	M      int  `json:"m"`
	N      int  `json:"n"`
	K      int  `json:"k"`
	TransA bool `json:"trans_a"`
	TransB bool `json:"trans_b"`
}

// gemmRow is one measurement, a JSON line with --json.
type gemmRow struct {
	Peak bool `json:"peak,omitempty"`
	gemmShape
	Threads int     `json:"threads"`
	GFLOPS  float64 `json:"gflops"`
	// PctPeak is GFLOPS over the FMA loop's GFLOP/s on as many threads.
	PctPeak float64 `json:"pct_peak"`
	Kernel  string  `json:"kernel"`
}

// benchGemmCommand is `gorun bench gemm`: the trainer's fp32 matrix
// products in GFLOP/s beside the machine's FMA peak, measured in one run.
func benchGemmCommand() *cli.Command {
	return &cli.Command{
		Name:  "gemm",
		Usage: "GFLOP/s of the trainer's fp32 matrix products beside the FMA peak",
		Description: "Times kernels.MatMul on square products (--sizes) and the transformer's shapes\n" +
			"(--shapes, MxNxK with an optional :nn/:tn/:nt/:tt for transA/transB) on each thread\n" +
			"count, taking the best of --runs calls, and an FMA loop on registers for the peak.",
		Flags: []cli.Flag{
			&cli.IntSliceFlag{Name: "threads", Value: cli.NewIntSlice(1, 2), Usage: "thread counts to measure"},
			&cli.IntSliceFlag{Name: "sizes", Value: cli.NewIntSlice(256, 1024, 2048), Usage: "square products N³ to measure"},
			&cli.StringSliceFlag{Name: "shapes", Value: cli.NewStringSlice(
				"512x256x64", "512x64x256", "512x256x64:nt", "512x64x256:nt", "256x64x512:tn", "64x256x512:tn",
			), Usage: "other products, MxNxK[:ops] with ops nn, tn, nt or tt"},
			&cli.IntFlag{Name: "runs", Value: 5, Usage: "calls per product (and peak loops); the best counts"},
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
	var shapes []gemmShape
	for _, s := range c.IntSlice("sizes") {
		if s < 1 {
			return cli.Exit(fmt.Sprintf("bench gemm: --sizes=%d: want at least 1", s), exitUsage)
		}
		shapes = append(shapes, gemmShape{M: s, N: s, K: s})
	}
	for _, s := range c.StringSlice("shapes") {
		sh, err := parseGemmShape(s)
		if err != nil {
			return cli.Exit(fmt.Sprintf("bench gemm: --shapes=%s: %v", s, err), exitUsage)
		}
		shapes = append(shapes, sh)
	}

	out := c.App.Writer
	var rows []gemmRow
	for _, t := range threads {
		e := kernels.New(t)
		peak := 0.0
		for range runs {
			peak = max(peak, e.PeakGFLOPS(100*time.Millisecond))
		}
		row := gemmRow{Peak: true, Threads: t, GFLOPS: peak, PctPeak: 100, Kernel: e.Kernel()}
		rows = append(rows, row)
		if c.Bool("json") {
			if err := json.NewEncoder(out).Encode(row); err != nil {
				return fmt.Errorf("bench gemm: write: %w", err)
			}
		}
		for _, sh := range shapes {
			g := timeGemm(e, sh, runs)
			row := gemmRow{gemmShape: sh, Threads: t, GFLOPS: g, PctPeak: 100 * g / peak, Kernel: e.Kernel()}
			rows = append(rows, row)
			if c.Bool("json") {
				if err := json.NewEncoder(out).Encode(row); err != nil {
					return fmt.Errorf("bench gemm: write: %w", err)
				}
			}
		}
	}
	if !c.Bool("json") {
		printGemmTable(out, rows, runs)
	}
	return nil
}

// parseGemmShape reads MxNxK[:ops], ops being nn, tn, nt or tt.
func parseGemmShape(s string) (gemmShape, error) {
	dims, ops, hasOps := strings.Cut(s, ":")
	parts := strings.Split(dims, "x")
	if len(parts) != 3 {
		return gemmShape{}, fmt.Errorf("want MxNxK[:ops], e.g. 512x256x64:nt")
	}
	var d [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 1 {
			return gemmShape{}, fmt.Errorf("dimension %q: want a positive integer", p)
		}
		d[i] = v
	}
	sh := gemmShape{M: d[0], N: d[1], K: d[2]}
	if hasOps {
		if len(ops) != 2 || strings.Trim(ops, "nt") != "" {
			return gemmShape{}, fmt.Errorf("ops %q: want nn, tn, nt or tt", ops)
		}
		sh.TransA, sh.TransB = ops[0] == 't', ops[1] == 't'
	}
	return sh, nil
}

// timeGemm returns the GFLOP/s of the fastest of runs calls of the
// product sh on e, after one call to warm the caches and pools.
func timeGemm(e *kernels.Engine, sh gemmShape, runs int) float64 {
	r := rand.New(rand.NewPCG(1, 2))
	fill := func(n int) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = r.Float32()*2 - 1
		}
		return s
	}
	a, b, c := fill(sh.M*sh.K), fill(sh.K*sh.N), make([]float32, sh.M*sh.N)
	e.MatMul(c, a, b, sh.M, sh.N, sh.K, sh.TransA, sh.TransB, false)
	best := time.Duration(1<<63 - 1)
	for range runs {
		// Time enough calls together that the clock's resolution and a
		// goroutine start do not dominate small products.
		calls := max(1, int(2e6/float64(sh.M*sh.N*sh.K)*100))
		start := time.Now()
		for range calls {
			e.MatMul(c, a, b, sh.M, sh.N, sh.K, sh.TransA, sh.TransB, false)
		}
		best = min(best, time.Since(start)/time.Duration(calls))
	}
	return 2 * float64(sh.M) * float64(sh.N) * float64(sh.K) / best.Seconds() / 1e9
}

func printGemmTable(w io.Writer, rows []gemmRow, runs int) {
	if len(rows) > 0 {
		fmt.Fprintf(w, "kernel %s, best of %d runs (numbers vary with other load on the machine)\n", rows[0].Kernel, runs)
	}
	fmt.Fprintf(w, "%-22s %7s %9s %7s\n", "product (m×n×k op)", "threads", "GFLOP/s", "% peak")
	for _, r := range rows {
		name := "FMA peak"
		if !r.Peak {
			ops := map[bool]string{false: "n", true: "t"}
			name = fmt.Sprintf("%d×%d×%d %s%s", r.M, r.N, r.K, ops[r.TransA], ops[r.TransB])
		}
		fmt.Fprintf(w, "%-22s %7d %9.1f %6.0f%%\n", name, r.Threads, r.GFLOPS, r.PctPeak)
	}
}
