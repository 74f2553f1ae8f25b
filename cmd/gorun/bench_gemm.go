package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/trainer/kernels"
)

// gemmShape is one product of `gorun bench gemm`: op(A) m×k times op(B) k×n.
type gemmShape struct {
	M      int  `json:"m,omitempty"`
	N      int  `json:"n,omitempty"`
	K      int  `json:"k,omitempty"`
	TransA bool `json:"trans_a,omitempty"`
	TransB bool `json:"trans_b,omitempty"`
}

// gemmRow is one measurement, a JSON line with --json.
type gemmRow struct {
	Peak bool `json:"peak,omitempty"`
	gemmShape
	Threads int `json:"threads"`
	// GFLOPS is by the wall clock; PctPeak is it over the FMA loop's
	// GFLOPS on as many threads.
	GFLOPS  float64 `json:"gflops"`
	PctPeak float64 `json:"pct_peak"`
	Kernel  string  `json:"kernel"`
	// Precision is the inputs' format, fp32 or bf16 (whose peak is
	// VDPBF16PS's, twice the FMA's).
	Precision string `json:"precision"`
}

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
				"this CPU runs " + strings.Join(allKernels(), ", ")},
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

	kernNames, err := benchKernels(c.StringSlice("kernels"))
	if err != nil {
		return cli.Exit(fmt.Sprintf("bench gemm: %v", err), exitUsage)
	}

	out := c.App.Writer
	var rows []gemmRow
	emit := func(row gemmRow) error {
		rows = append(rows, row)
		if !c.Bool("json") {
			return nil
		}
		if err := json.NewEncoder(out).Encode(row); err != nil {
			return fmt.Errorf("bench gemm: write: %w", err)
		}
		return nil
	}
	for _, kern := range kernNames {
		for _, t := range threads {
			e, err := kernels.NewWithKernel(t, kern)
			if err != nil {
				return cli.Exit(fmt.Sprintf("bench gemm: %v", err), exitUsage)
			}
			if err := benchOneKernel(e, shapes, runs, emit); err != nil {
				return err
			}
		}
	}
	if !c.Bool("json") {
		printGemmTable(out, rows, runs)
	}
	return nil
}

// benchKernels returns the micro-kernels to measure: the names asked
// for, each checked against what the CPU runs, or by default every SIMD
// kernel, fp32 then bf16 (the portable fp32 one only when there is no
// SIMD fp32 kernel).
func benchKernels(asked []string) ([]string, error) {
	avail := allKernels()
	if len(asked) == 0 {
		fp32, bf16 := kernels.Available(), kernels.AvailableBF16()
		if len(fp32) > 1 {
			fp32 = fp32[:len(fp32)-1]
		}
		return append(fp32, bf16[:len(bf16)-1]...), nil
	}
	for _, k := range asked {
		if !slices.Contains(avail, k) {
			return nil, fmt.Errorf("--kernels=%s: this CPU runs only %s", k, strings.Join(avail, ", "))
		}
	}
	return asked, nil
}

// allKernels names every fp32 and bf16 micro-kernel this CPU runs.
func allKernels() []string {
	return append(kernels.Available(), kernels.AvailableBF16()...)
}

// benchOneKernel emits the FMA peak row of e's kernel and thread count,
// then one row per product in shapes against that peak.
func benchOneKernel(e *kernels.Engine, shapes []gemmShape, runs int, emit func(gemmRow) error) error {
	t := e.Threads()
	var peak float64
	for range runs {
		peak = max(peak, e.PeakGFLOPS(20*time.Millisecond))
	}
	prec := e.Precision().String()
	if err := emit(gemmRow{Peak: true, Threads: t, GFLOPS: peak, PctPeak: 100, Kernel: e.Kernel(), Precision: prec}); err != nil {
		return err
	}
	for _, sh := range shapes {
		wall := timeGemm(e, sh, runs)
		row := gemmRow{gemmShape: sh, Threads: t, GFLOPS: wall, PctPeak: 100 * wall / peak, Kernel: e.Kernel(), Precision: prec}
		if err := emit(row); err != nil {
			return err
		}
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

// timeGemm returns the best GFLOP/s of runs timings of the product sh
// on e, by the wall clock, after one call to warm the caches and pools.
// A timing covers enough calls to take about 5 ms.
func timeGemm(e *kernels.Engine, sh gemmShape, runs int) (best float64) {
	r := rand.New(rand.NewPCG(1, 2))
	fill := func(n int) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = r.Float32()*2 - 1
		}
		return s
	}
	a, b, c := fill(sh.M*sh.K), fill(sh.K*sh.N), make([]float32, sh.M*sh.N)
	flops := 2 * float64(sh.M) * float64(sh.N) * float64(sh.K)
	start := time.Now()
	e.MatMul(c, a, b, sh.M, sh.N, sh.K, sh.TransA, sh.TransB, false)
	calls := max(1, int(5*time.Millisecond/max(time.Since(start), time.Microsecond)))
	for range runs {
		start := time.Now()
		for range calls {
			e.MatMul(c, a, b, sh.M, sh.N, sh.K, sh.TransA, sh.TransB, false)
		}
		best = max(best, flops*float64(calls)/time.Since(start).Seconds()/1e9)
	}
	return best
}

func printGemmTable(w io.Writer, rows []gemmRow, runs int) {
	fmt.Fprintf(w, "best of %d timings by the wall clock; %% peak is of the multiply-add loop (FMA; VDPBF16PS for bf16) "+
		"of the row's kernel on as many threads\n", runs)
	fmt.Fprintf(w, "%-22s %-16s %7s %9s %7s\n", "product (m×n×k op)", "kernel", "threads", "GFLOP/s", "% peak")
	for _, r := range rows {
		name := "FMA peak"
		if r.Precision == kernels.BF16.String() {
			name = "VDPBF16PS peak"
		}
		if !r.Peak {
			ops := map[bool]string{false: "n", true: "t"}
			name = fmt.Sprintf("%d×%d×%d %s%s", r.M, r.N, r.K, ops[r.TransA], ops[r.TransB])
		}
		fmt.Fprintf(w, "%-22s %-16s %7d %9.1f %6.0f%%\n", name, r.Kernel, r.Threads, r.GFLOPS, r.PctPeak)
	}
}
