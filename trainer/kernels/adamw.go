package kernels

import (
	"fmt"
	"math"
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

// AdamW applies one AdamW update to params, its moments m and v, from
// grads, with weight decay where decay[i] (nil: nowhere). Per element,
// in float64, each operation rounded on its own (no fused multiply-add)
// in this order:
//
//	g = Clip·grads[i]
//	p = params[i], times Shrink where decay[i]
//	m = Beta1·m[i] + (1-Beta1)·g
//	v = Beta2·v[i] + ((1-Beta2)·g)·g
//	m[i], v[i] = float32(m), float32(v)
//	params[i] = float32(p - (LR·(m/BC1)) / (sqrt(v/BC2) + Eps))
//
// Elements are independent and every kernel computes exactly this, so the
// bits do not depend on the kernel, the thread count or how a caller
// splits the buffer. The buffer is split over the Engine's threads in
// chunks of a fixed size. grads is left unchanged. It panics when the
// lengths differ: that is a bug in the caller.
func (e *Engine) AdamW(params, m, v, grads []float32, decay []bool, s AdamWStep) {
	n := len(params)
	if len(m) != n || len(v) != n || len(grads) != n || (decay != nil && len(decay) != n) {
		panic(fmt.Sprintf("kernels: AdamW with len(params)=%d len(m)=%d len(v)=%d len(grads)=%d len(decay)=%d",
			n, len(m), len(v), len(grads), len(decay)))
	}
	update := adamwKernel(e.kern)
	e.ForChunks(n, adamwChunk, func(lo, hi int) {
		var d []bool
		if decay != nil {
			d = decay[lo:hi]
		}
		update(params[lo:hi], m[lo:hi], v[lo:hi], grads[lo:hi], d, &s)
	})
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
