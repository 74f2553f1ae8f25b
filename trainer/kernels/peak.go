package kernels

import (
	"sync"
	"time"
)

// PeakGFLOPS runs the Engine's multiply-add loop (fused multiply-adds on
// registers only, with the micro-kernel's instructions) on Threads
// goroutines for about d and returns the fp32 GFLOP/s they reached
// together: the ceiling MatMul's speed is measured against. It returns 0
// when d is not positive.
func (e *Engine) PeakGFLOPS(d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	const rounds = 1 << 14
	flops := make([]int, e.threads)
	var wg sync.WaitGroup
	start := time.Now()
	for t := range e.threads {
		wg.Go(func() {
			for time.Since(start) < d {
				flops[t] += e.kern.peak(rounds)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	total := 0
	for _, f := range flops {
		total += f
	}
	return float64(total) / elapsed.Seconds() / 1e9
}
