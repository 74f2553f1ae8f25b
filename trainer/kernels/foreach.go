package kernels

// ForEach runs fn(0..items-1) on up to Threads() goroutines and returns
// when every item has returned. The items form w = min(Threads(), items)
// groups, item i in group i mod w; a group's items run in order on one
// goroutine, whichever takes the group. Each item runs once, on one
// goroutine, so work that keeps each item's result to itself gives the
// same bits on any run and any thread count. The goroutines are the
// Engine's team (see team), which a call nested in fn does not wait for.
func (e *Engine) ForEach(items int, fn func(i int)) {
	w := min(e.threads, items)
	e.run(w, func(g int) {
		for i := g; i < items; i += w {
			fn(i)
		}
	})
}

// run calls part(0..parts-1), each once, on up to parts goroutines (the
// caller's among them), and returns when all have returned;
// parts <= Threads().
func (e *Engine) run(parts int, part func(g int)) {
	if e.team == nil {
		for g := range parts {
			part(g)
		}
		return
	}
	e.team.run(parts, part)
}
