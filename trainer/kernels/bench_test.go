package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkMatMul reports GFLOP/s for square products and the
// transformer's shapes, each micro-kernel, on 1 and 2 goroutines.
func BenchmarkMatMul(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	shapes := []struct {
		m, n, k        int
		transA, transB bool
	}{
		{256, 256, 256, false, false},
		{1024, 1024, 1024, false, false},
		{512, 256, 64, false, false},
		{512, 64, 256, false, false},
		{512, 64, 256, false, true},
		{256, 64, 512, true, false},
	}
	for _, kern := range kernelsForCPU() {
		for _, threads := range []int{1, 2} {
			for _, s := range shapes {
				name := fmt.Sprintf("%s/t%d/%dx%dx%d/ta=%v,tb=%v", kern.name, threads, s.m, s.n, s.k, s.transA, s.transB)
				b.Run(name, func(b *testing.B) {
					e := newEngine(threads, kern)
					a, bm, c := randSlice(r, s.m*s.k), randSlice(r, s.k*s.n), make([]float32, s.m*s.n)
					for b.Loop() {
						e.MatMul(c, a, bm, s.m, s.n, s.k, s.transA, s.transB, false)
					}
					b.ReportMetric(2*float64(s.m*s.n*s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}

// BenchmarkMatMulBF16 is BenchmarkMatMul for the fastest bf16 kernel,
// each shape next to the fastest fp32 kernel, on the model's shapes (the
// bench model's c_attn, mlp c_proj, and a weight gradient).
func BenchmarkMatMulBF16(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	shapes := []struct {
		m, n, k        int
		transA, transB bool
	}{
		{1024, 1024, 1024, false, false},
		{2048, 384, 128, false, true},
		{2048, 128, 512, false, true},
		{512, 128, 2048, true, false},
	}
	engines := []*Engine{New(1), New(1).WithPrecision(BF16)}
	for _, threads := range []int{1, 2} {
		for _, s := range shapes {
			for _, e := range engines {
				e := e.WithThreads(threads)
				name := fmt.Sprintf("t%d/%dx%dx%d/ta=%v,tb=%v/%s", threads, s.m, s.n, s.k, s.transA, s.transB, e.Kernel())
				b.Run(name, func(b *testing.B) {
					a, bm, c := randSlice(r, s.m*s.k), randSlice(r, s.k*s.n), make([]float32, s.m*s.n)
					for b.Loop() {
						e.MatMul(c, a, bm, s.m, s.n, s.k, s.transA, s.transB, false)
					}
					b.ReportMetric(2*float64(s.m*s.n*s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}
