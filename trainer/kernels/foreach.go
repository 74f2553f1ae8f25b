package kernels

import "sync"

// ForEach runs fn(0..items-1) on up to Threads() goroutines, item i
// always on goroutine i mod Threads() (goroutine 0 is the caller's), and
// returns when every item has returned. The assignment does not depend
// on timing, so work that keeps each item's result to itself gives the
// same bits on any run. fn must not call ForEach on the same Engine.
func (e *Engine) ForEach(items int, fn func(i int)) {
	w := min(e.threads, items)
	if w <= 1 {
		for i := range items {
			fn(i)
		}
		return
	}
	var wg sync.WaitGroup
	run := func(g int) {
		for i := g; i < items; i += w {
			fn(i)
		}
	}
	for g := 1; g < w; g++ {
		wg.Go(func() { run(g) })
	}
	run(0)
	wg.Wait()
}
