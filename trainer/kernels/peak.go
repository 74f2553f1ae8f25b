package kernels

import (
	"runtime"
	"sync"
	"time"
)

// PeakGFLOPS runs the Engine's multiply-add loop (fused multiply-adds on
// registers only, with the micro-kernel's instructions; for a BF16 Engine
// its bf16 kernel's dot products) on Threads goroutines for about d and
// returns the GFLOP/s they reached together: the ceiling MatMul's speed
// is measured against. It returns 0 when d is not positive.
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
				flops[t] += e.peakLoop(rounds)
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

// peakRuns×peakEach is how long MeasurePeak runs the multiply-add loop
// on each thread, in that thread's CPU time.
const (
	peakRuns = 3
	peakEach = 20 * time.Millisecond
)

// MeasurePeak is the fp32 FMA peak of the Engine's threads with its
// kernel's instructions (for a BF16 Engine, the peak of its bf16 kernel's
// dot-product instruction), in GFLOP/s: the multiply-add loop runs on Threads
// goroutines, each locked to its OS thread for peakEach of that thread's
// CPU time, and the rates (flops per CPU second) add up; the best of
// peakRuns such runs counts. Timing each thread by its own CPU time makes
// the figure the hardware's, not what is left of it while other processes
// share the cores; where the thread's CPU time is unknown (not Linux) it
// falls back to PeakGFLOPS by the wall clock. It takes about 60 ms on an
// idle machine.
func (e *Engine) MeasurePeak() float64 {
	var best float64
	for range peakRuns {
		best = max(best, e.cpuPeak(peakEach))
	}
	return best
}

// cpuPeak is one run of MeasurePeak.
func (e *Engine) cpuPeak(d time.Duration) float64 {
	const rounds = 1 << 12
	rates := make([]float64, e.threads)
	clockOK := make([]bool, e.threads)
	var wg sync.WaitGroup
	for t := range e.threads {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			t0, ok := threadCPU()
			if !ok {
				return
			}
			flops, used := 0, time.Duration(0)
			for used < d {
				flops += e.peakLoop(rounds)
				t1, _ := threadCPU()
				used = t1 - t0
			}
			rates[t], clockOK[t] = float64(flops)/used.Seconds()/1e9, true
		})
	}
	wg.Wait()
	total := 0.0
	for t, r := range rates {
		if !clockOK[t] {
			return e.PeakGFLOPS(d)
		}
		total += r
	}
	return total
}

// peakLoop runs rounds of the multiply-add loop of the kernel that runs
// the Engine's products and returns the flops it did.
func (e *Engine) peakLoop(rounds int) int {
	if e.bf != nil {
		return e.bf.peak(rounds)
	}
	return e.kern.peak(rounds)
}
