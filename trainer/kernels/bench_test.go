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

// BenchmarkMatMulBF16 is BenchmarkMatMul for the bf16 kernels, in flops
// of the bf16 products (2mnk).
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
	for _, kern := range bf16KernelsForCPU()[:1] {
		for _, threads := range []int{1, 2} {
			for _, s := range shapes {
				name := fmt.Sprintf("%s/t%d/%dx%dx%d/ta=%v,tb=%v", kern.name, threads, s.m, s.n, s.k, s.transA, s.transB)
				b.Run(name, func(b *testing.B) {
					e := newEngine(threads, goKernel())
					e.bf = kern
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
