package model

import "github.com/gorun/gorun/trainer/kernels"

// pool runs independent work items on up to threads goroutines (kernels.Engine.ForEach: each
// item once, on one goroutine), and returns when all are done. eng is single-threaded, for products inside
// an item, so the goroutines do not multiply.
type pool struct {
	threads int
	team    *kernels.Engine // runs the items: its ForEach
	eng     *kernels.Engine
}

func (p pool) forEach(n int, fn func(i int)) { p.team.ForEach(n, fn) }

// forRows splits rows 0..n-1 into up to threads contiguous ranges and runs fn on each, one
// goroutine per range. Callers only use it for row-independent work, so the result does not
// depend on the split.
func (p pool) forRows(n int, fn func(lo, hi int)) {
	w := max(min(p.threads, n/16), 1) // at least 16 rows a goroutine
	p.forEach(w, func(i int) { fn(i*n/w, (i+1)*n/w) })
}
