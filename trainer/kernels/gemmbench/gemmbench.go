// Package gemmbench times the trainer's matrix products (kernels.MatMul)
// in GFLOP/s beside the peak of each micro-kernel's multiply-add loop,
// measured in the same run: `gorun bench gemm`.
package gemmbench

import (
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/trainer/kernels"
)

// Shape is one product: op(A) m×k times op(B) k×n.
type Shape struct {
	M      int  `json:"m,omitempty"`
	N      int  `json:"n,omitempty"`
	K      int  `json:"k,omitempty"`
	TransA bool `json:"trans_a,omitempty"`
	TransB bool `json:"trans_b,omitempty"`
}

// Row is one measurement: a product, or (Peak) the multiply-add loop
// of its kernel, on a thread count.
type Row struct {
	Peak bool `json:"peak,omitempty"`
	Shape
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

// Config is what Run measures: every product of Shapes on every thread
// count of Threads with every micro-kernel of Kernels (see Kernels), each
// the best of Runs timings.
type Config struct {
	Threads []int
	Shapes  []Shape
	Kernels []string
	Runs    int
}

// Run times cfg's products, kernel by kernel and thread count by thread
// count: for each it passes emit the peak row of the kernel's
// multiply-add loop, then one row per product against that peak. It
// returns the first error of emit or of starting an engine; nothing it
// does blocks on anything but the CPU.
func Run(cfg Config, emit func(Row) error) error {
	if cfg.Runs < 1 {
		return fmt.Errorf("gemmbench: runs=%d: want at least 1", cfg.Runs)
	}
	for _, kern := range cfg.Kernels {
		for _, t := range cfg.Threads {
			e, err := kernels.NewWithKernel(t, kern)
			if err != nil {
				return err
			}
			if err := measure(e, cfg.Shapes, cfg.Runs, emit); err != nil {
				return err
			}
		}
	}
	return nil
}

// Kernels returns the micro-kernels to measure: the names asked
// for, each checked against what the CPU runs, or by default every SIMD
// kernel, fp32 then bf16 (the portable fp32 one only when there is no
// SIMD fp32 kernel).
func Kernels(asked []string) ([]string, error) {
	avail := AllKernels()
	if len(asked) == 0 {
		fp32, bf16 := kernels.Available(), kernels.AvailableBF16()
		if len(fp32) > 1 {
			fp32 = fp32[:len(fp32)-1]
		}
		return append(fp32, bf16[:len(bf16)-1]...), nil
	}
	for _, k := range asked {
		if !slices.Contains(avail, k) {
			return nil, fmt.Errorf("%s: this CPU runs only %s", k, strings.Join(avail, ", "))
		}
	}
	return asked, nil
}

// AllKernels names every fp32 and bf16 micro-kernel this CPU runs.
func AllKernels() []string {
	return append(kernels.Available(), kernels.AvailableBF16()...)
}

// measure emits the FMA peak row of e's kernel and thread count,
// then one row per product in shapes against that peak.
func measure(e *kernels.Engine, shapes []Shape, runs int, emit func(Row) error) error {
	t := e.Threads()
	var peak float64
	for range runs {
		peak = max(peak, e.PeakGFLOPS(20*time.Millisecond))
	}
	prec := e.Precision().String()
	if err := emit(Row{Peak: true, Threads: t, GFLOPS: peak, PctPeak: 100, Kernel: e.Kernel(), Precision: prec}); err != nil {
		return err
	}
	for _, sh := range shapes {
		wall := timeGemm(e, sh, runs)
		row := Row{Shape: sh, Threads: t, GFLOPS: wall, PctPeak: 100 * wall / peak, Kernel: e.Kernel(), Precision: prec}
		if err := emit(row); err != nil {
			return err
		}
	}
	return nil
}

// ParseShape reads MxNxK[:ops], ops being nn, tn, nt or tt.
func ParseShape(s string) (Shape, error) {
	dims, ops, hasOps := strings.Cut(s, ":")
	parts := strings.Split(dims, "x")
	if len(parts) != 3 {
		return Shape{}, fmt.Errorf("want MxNxK[:ops], e.g. 512x256x64:nt")
	}
	var d [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 1 {
			return Shape{}, fmt.Errorf("dimension %q: want a positive integer", p)
		}
		d[i] = v
	}
	sh := Shape{M: d[0], N: d[1], K: d[2]}
	if hasOps {
		if len(ops) != 2 || strings.Trim(ops, "nt") != "" {
			return Shape{}, fmt.Errorf("ops %q: want nn, tn, nt or tt", ops)
		}
		sh.TransA, sh.TransB = ops[0] == 't', ops[1] == 't'
	}
	return sh, nil
}

// timeGemm returns the best GFLOP/s of runs timings of the product sh
// on e, by the wall clock, after one call to warm the caches and pools.
// A timing covers enough calls to take about 5 ms.
func timeGemm(e *kernels.Engine, sh Shape, runs int) (best float64) {
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

// WriteTable writes rows to w as a table under a line saying how they
// were measured (the best of runs timings).
func WriteTable(w io.Writer, rows []Row, runs int) error {
	tw := &errWriter{w: w}
	fmt.Fprintf(tw, "best of %d timings by the wall clock; %% peak is of the multiply-add loop (FMA; VDPBF16PS for bf16) "+
		"of the row's kernel on as many threads\n", runs)
	fmt.Fprintf(tw, "%-22s %-16s %7s %9s %7s\n", "product (m×n×k op)", "kernel", "threads", "GFLOP/s", "% peak")
	for _, r := range rows {
		name := "FMA peak"
		if r.Precision == kernels.BF16.String() {
			name = "VDPBF16PS peak"
		}
		if !r.Peak {
			ops := map[bool]string{false: "n", true: "t"}
			name = fmt.Sprintf("%d×%d×%d %s%s", r.M, r.N, r.K, ops[r.TransA], ops[r.TransB])
		}
		fmt.Fprintf(tw, "%-22s %-16s %7d %9.1f %6.0f%%\n", name, r.Kernel, r.Threads, r.GFLOPS, r.PctPeak)
	}
	return tw.err
}

// errWriter is w that keeps its first error and writes nothing after it.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}
