package kernels

import (
	"fmt"
	"math"
)

// Causal attention's softmax and its backward, a head's t×t matrix at a time. Row i holds
// i+1 live elements (the columns j <= i the causal mask keeps); the others become 0.

// softmaxVector is the length the softmax of a row rounds its live elements up to, so the
// vector kernels (16 or 8 lanes) leave no elements to their scalar tails.
const softmaxVector = 16

// CausalSoftmax turns each row i of the t×t matrix p (row-major, contiguous), whose first
// i+1 elements are scores, into softmax(scale·p[i, :i+1]) followed by zeros. Its bits are
// those of Max, ExpSum and Scale (by 1/sum) called in turn on the row's live elements
// followed by -Inf up to a multiple of 16 (or the row's end): their exponential is clamped
// to about 1e-38, which does not change a sum of at least 1 (the largest score's term) by
// more than its last bit, and they are zeroed afterwards. scale must be positive. It panics
// when t is negative or p shorter than t×t: that is a bug in the caller.
func (e *Engine) CausalSoftmax(p []float32, t int, scale float32) {
	checkSoftmax("CausalSoftmax", p, p, t)
	row := softmaxRowFunc(e.kern)
	for i := range t {
		row(e, p[i*t:(i+1)*t], i+1, scale)
	}
}

// paddedSoftmax is a row of CausalSoftmax: it pads r's live elements with -Inf up to
// softmaxVector, runs soft on them and zeroes the rest of r.
func paddedSoftmax(e *Engine, r []float32, live int, scale float32, soft func(e *Engine, x []float32, scale float32)) {
	span := r[:softmaxSpan(live, len(r))]
	for j := live; j < len(span); j++ {
		span[j] = float32(math.Inf(-1))
	}
	soft(e, span, scale)
	clear(r[live:])
}

// softmaxSpan is live rounded up to a multiple of softmaxVector, or n if less.
func softmaxSpan(live, n int) int {
	return min((live+softmaxVector-1)/softmaxVector*softmaxVector, n)
}

// composedSoftmax is a row of CausalSoftmax by the Engine's Max, ExpSum and Scale: scale >
// 0, so the largest scaled score is the largest score scaled (rounding is monotonic).
func composedSoftmax(e *Engine, x []float32, scale float32) {
	mx := e.Max(x) * scale
	e.Scale(x, 1/e.ExpSum(x, x, scale, mx))
}

// CausalSoftmaxBackward turns each row i of the t×t matrix dp, the loss's gradient with
// respect to the probabilities p that CausalSoftmax computed with the same scale, into the
// gradient with respect to the scores: dp[i, j] = scale·p[i, j]·(dp[i, j] - s_i) for j <= i
// and 0 past it, with s_i the sum of p[i, k]·dp[i, k] for k <= i in eight interleaved
// partial sums (see goSoftmaxDot). The bits are the same on every kernel. It panics when t
// is negative or a matrix is shorter than t×t: that is a bug in the caller.
func (e *Engine) CausalSoftmaxBackward(dp, p []float32, t int, scale float32) {
	checkSoftmax("CausalSoftmaxBackward", dp, p, t)
	back := softmaxBackwardFunc(e.kern)
	for i := range t {
		back(dp[i*t:(i+1)*t], p[i*t:(i+1)*t], i+1, scale)
	}
}

// goSoftmaxBackward is a row of CausalSoftmaxBackward: d[:live] from p[:live], and d[live:]
// zero.
func goSoftmaxBackward(d, p []float32, live int, scale float32) {
	goSoftmaxUpdate(d[:live], p[:live], goSoftmaxDot(d, p, live), scale)
	clear(d[live:])
}

// goSoftmaxDot returns the sum of p[k]·d[k] for k < live in eight interleaved float32
// partial sums s0..s7 (s_l takes k = l mod 8 of the whole groups of eight, s0 then takes
// the rest in order) added as ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)). Every product and sum is
// rounded by itself (the conversions forbid fused multiply-adds), as in the assembly.
func goSoftmaxDot(d, p []float32, live int) float32 {
	p, d = p[:live], d[:live]
	var s0, s1, s2, s3, s4, s5, s6, s7 float32
	j := 0
	for ; j+8 <= live; j += 8 {
		a, x := p[j:j+8:j+8], d[j:j+8:j+8]
		s0 += float32(a[0] * x[0])
		s1 += float32(a[1] * x[1])
		s2 += float32(a[2] * x[2])
		s3 += float32(a[3] * x[3])
		s4 += float32(a[4] * x[4])
		s5 += float32(a[5] * x[5])
		s6 += float32(a[6] * x[6])
		s7 += float32(a[7] * x[7])
	}
	for ; j < live; j++ {
		s0 += float32(p[j] * d[j])
	}
	return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
}

// goSoftmaxUpdate sets d[j] = (scale·p[j])·(d[j] - s) for every j of d.
func goSoftmaxUpdate(d, p []float32, s, scale float32) {
	p = p[:len(d)]
	for j, a := range p {
		d[j] = float32(scale*a) * (d[j] - s)
	}
}

// checkSoftmax panics, naming op, when t is negative or a or b is shorter than t×t.
func checkSoftmax(op string, a, b []float32, t int) {
	if t < 0 || len(a) < t*t || len(b) < t*t {
		panic(fmt.Sprintf("kernels: %s t=%d with len=%d and %d", op, t, len(a), len(b)))
	}
}
