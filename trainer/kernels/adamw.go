package kernels

import (
	"fmt"
	"math"
	"sort"
)

// AdamWStep is the constants of one AdamW update, in float64.
type AdamWStep struct {
	LR           float64 // the step's learning rate
	Beta1, Beta2 float64 // decay rates of the first and second moments
	Eps          float64 // added to the root of the second moment
	Shrink       float64 // decoupled weight decay, 1 - LR·weight decay, where decay[i]
	BC1, BC2     float64 // bias corrections 1 - Beta1^t and 1 - Beta2^t of step t
	Clip         float64 // the factor the gradients are scaled by first
}

// adamwChunk is how many elements one item of AdamW's ForEach updates; a
// multiple of every kernel's vector, so only the last chunk has a tail.
const adamwChunk = 1 << 14

// adamwFunc updates params, m and v from grads (all of one length) as
// Engine.AdamW says, on one goroutine.
type adamwFunc func(params, m, v, grads []float32, decay []bool, s *AdamWStep)

// Span is the elements [Lo, Hi) of a buffer.
type Span struct{ Lo, Hi int }

// AdamW applies one AdamW update to params, its moments m and v, from
// grads, with weight decay on the elements of the spans in decay (sorted,
// disjoint, within the buffer; none: no decay anywhere). Per element, in
// float64, each operation rounded on its own (no fused multiply-add) in
// this order:
//
//	g = Clip·grads[i]
//	p = params[i], times Shrink where i is in a span of decay
//	m = Beta1·m[i] + (1-Beta1)·g
//	v = Beta2·v[i] + ((1-Beta2)·g)·g
//	m[i], v[i] = float32(m), float32(v)
//	params[i] = float32(p - (LR·(m/BC1)) / (sqrt(v/BC2) + Eps))
//
// Elements are independent and every kernel computes exactly this, so the
// bits do not depend on the kernel, the thread count or how a caller
// splits the buffer. The buffer is split over the Engine's threads in
// chunks of a fixed size. grads is left unchanged. It panics when the
// lengths differ or decay is not sorted, disjoint and within the buffer:
// those are bugs in the caller.
func (e *Engine) AdamW(params, m, v, grads []float32, decay []Span, s AdamWStep) {
	checkAdamW("AdamW", params, m, v, grads, decay)
	update := adamwKernel(e.kern)
	e.ForChunks(len(params), adamwChunk, func(lo, hi int) {
		e.adamwPieces(update, params, m, v, grads[lo:hi], decay, lo, hi, &s)
	})
}

// Kept is where AdamWKeeping copies the state as it was before the
// update: Params, M and V, each as long as the buffer.
type Kept struct{ Params, M, V []float32 }

// AdamWKeeping is AdamW that first copies each element's params, m and v,
// as they were before the update, into keep: the rollback copy of a
// trainer. keep.Params may be grads' own memory, element for element (a
// trainer keeps the step's gradient where the copy of the parameters
// goes): each chunk of grads is read aside before keep is written there.
// keep must not overlap params, m or v, nor grads otherwise. params, m
// and v get AdamW's bits. It panics where AdamW does, or when keep's
// lengths differ from the buffer's.
func (e *Engine) AdamWKeeping(params, m, v, grads []float32, keep Kept, decay []Span, s AdamWStep) {
	n := len(params)
	checkAdamW("AdamWKeeping", params, m, v, grads, decay)
	if len(keep.Params) != n || len(keep.M) != n || len(keep.V) != n {
		panic(fmt.Sprintf("kernels: AdamWKeeping with len(params)=%d, keep's %d %d %d",
			n, len(keep.Params), len(keep.M), len(keep.V)))
	}
	update := adamwKernel(e.kern)
	chunks := ceilDiv(n, adamwChunk)
	threads := min(e.threads, chunks)
	aside, _ := e.aside.Get().(*[]float32) // one chunk of grads per thread
	if aside == nil || len(*aside) < threads*adamwChunk {
		b := make([]float32, e.threads*adamwChunk)
		aside = &b
	}
	defer e.aside.Put(aside)
	e.run(threads, func(g int) {
		buf := (*aside)[g*adamwChunk : (g+1)*adamwChunk]
		for c := g; c < chunks; c += threads {
			lo := c * adamwChunk
			hi := min(n, lo+adamwChunk)
			grad := buf[:hi-lo]
			copy(grad, grads[lo:hi])
			copy(keep.Params[lo:hi], params[lo:hi])
			copy(keep.M[lo:hi], m[lo:hi])
			copy(keep.V[lo:hi], v[lo:hi])
			e.adamwPieces(update, params, m, v, grad, decay, lo, hi, &s)
		}
	})
}

// checkAdamW panics, naming op, when the lengths of an update's buffers
// differ or decay's spans are not sorted, disjoint and within them.
func checkAdamW(op string, params, m, v, grads []float32, decay []Span) {
	n := len(params)
	if len(m) != n || len(v) != n || len(grads) != n {
		panic(fmt.Sprintf("kernels: %s with len(params)=%d len(m)=%d len(v)=%d len(grads)=%d",
			op, n, len(m), len(v), len(grads)))
	}
	if err := CheckSpans(decay, n); err != nil {
		panic("kernels: " + op + ": " + err.Error())
	}
}

// adamwPieces updates elements [lo, hi) of params, m and v from grad (the
// gradient of those elements, grad[0] is element lo's), in pieces that
// are decayed whole or not at all.
func (e *Engine) adamwPieces(update adamwFunc, params, m, v, grad []float32, decay []Span, lo, hi int, s *AdamWStep) {
	next := sort.Search(len(decay), func(i int) bool { return decay[i].Hi > lo })
	for at := lo; at < hi; {
		end, d := hi, []bool(nil)
		switch {
		case next < len(decay) && decay[next].Lo <= at: // inside a decayed span
			end = min(hi, decay[next].Hi)
			d = e.decayed[:end-at]
			next++
		case next < len(decay): // before the next one
			end = min(hi, decay[next].Lo)
		}
		update(params[at:end], m[at:end], v[at:end], grad[at-lo:end-lo], d, s)
		at = end
	}
}

// CheckSpans says why spans are not sorted, disjoint, non-empty spans
// within a buffer of n elements; nil when they are.
func CheckSpans(spans []Span, n int) error {
	last := 0
	for i, sp := range spans {
		if sp.Lo < last || sp.Hi <= sp.Lo || sp.Hi > n {
			return fmt.Errorf("span %d [%d, %d) is not after %d, non-empty and within %d elements", i, sp.Lo, sp.Hi, last, n)
		}
		last = sp.Hi
	}
	return nil
}

// goAdamW is the portable adamwFunc. The explicit float64 conversions
// round each product, so no compiler fuses it into a multiply-add: the
// bits are the same on every architecture and match the assembly.
func goAdamW(params, m, v, grads []float32, decay []bool, s *AdamWStep) {
	m, v, grads = m[:len(params)], v[:len(params)], grads[:len(params)]
	oneMinusBeta1, oneMinusBeta2 := 1-s.Beta1, 1-s.Beta2
	for i, p := range params {
		g := float64(s.Clip * float64(grads[i]))
		pp := float64(p)
		if decay != nil && decay[i] {
			pp *= s.Shrink
		}
		mi := float64(s.Beta1*float64(m[i])) + float64(oneMinusBeta1*g)
		vi := float64(s.Beta2*float64(v[i])) + float64(float64(oneMinusBeta2*g)*g)
		m[i], v[i] = float32(mi), float32(vi)
		pp -= float64(s.LR*(mi/s.BC1)) / (math.Sqrt(vi/s.BC2) + s.Eps)
		params[i] = float32(pp)
	}
}
