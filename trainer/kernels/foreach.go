package kernels

// ForEach runs fn(0..items-1) on up to Threads() goroutines, item i
// always on goroutine i mod Threads() (goroutine 0 is the caller's), and
// returns when every item has returned. The assignment does not depend
// on timing, so work that keeps each item's result to itself gives the
// same bits on any run. The goroutines are the Engine's team (see team),
// which a call nested in fn does not wait for.
func (e *Engine) ForEach(items int, fn func(i int)) {
	w := min(e.threads, items)
	e.run(w, func(g int) {
		for i := g; i < items; i += w {
			fn(i)
		}
	})
}

// run calls part(0..parts-1) on a goroutine each, part 0 on the
// caller's, and returns when all have returned; parts <= Threads().
func (e *Engine) run(parts int, part func(g int)) {
	if e.team == nil {
		for g := range parts {
			part(g)
		}
		return
	}
	e.team.run(parts, part)
}
