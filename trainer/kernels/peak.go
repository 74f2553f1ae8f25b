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

// peakRuns×peakEach is how long MeasurePeak runs the multiply-add loop.
const (
	peakRuns = 5
	peakEach = 20 * time.Millisecond
)

// MeasurePeak is the best of a few short PeakGFLOPS runs (about 100 ms in
// all): the fp32 FMA peak of the Engine's threads with its kernel's
// instructions. The best, not the mean, because other load on a shared
// machine only ever lowers a run.
func (e *Engine) MeasurePeak() float64 {
	var best float64
	for range peakRuns {
		best = max(best, e.PeakGFLOPS(peakEach))
	}
	return best
}
