package kernels

// ForChunks splits [0, n) into chunks of chunk elements (the last one
// shorter) and runs fn(lo, hi) for each on the Engine's threads as
// ForEach does. The chunks do not depend on the thread count, so work
// that keeps each chunk's result to itself gives the same bits on any.
// It returns when every chunk is done. It panics when chunk < 1: that is a bug in the caller.
func (e *Engine) ForChunks(n, chunk int, fn func(lo, hi int)) {
	if chunk < 1 {
		panic("kernels: ForChunks with chunk < 1")
	}
	e.ForEach(ceilDiv(n, chunk), func(c int) {
		lo := c * chunk
		fn(lo, min(n, lo+chunk))
	})
}
