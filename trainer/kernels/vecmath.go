package kernels

import (
	"fmt"
	"math"
)

// geluC is sqrt(2/pi), the constant of GELU's tanh approximation.
const geluC = 0.7978845608028654

// expf is exp(x) in float32 within 2e-7 relative of math.Exp, with x
// clamped to [-87, 88] first: exp(x) = 2^k · exp(r) with k = round(x/ln 2)
// and |r| <= ln(2)/2, exp(r) by its degree-7 Taylor polynomial. The
// vector kernels compute the same, lane by lane. Below -87 it returns
// exp(-87), about 1.6e-38, where a softmax's terms do not count; above 88
// exp(88), about 1.65e38, which is large enough for tanh to saturate. It
// returns NaN for NaN.
func expf(x float32) float32 {
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693145751953125 // ln 2 split so that k*ln2hi is exact in float32
		ln2lo = 1.42860682030941723212e-6
		// Adding and subtracting 1.5·2^23 rounds to the nearest integer
		// in float32 (Go does not reassociate floating-point sums).
		round = 12582912
	)
	x = min(max(x, -87), 88)
	k := (x*log2e + round) - round
	r := x - k*ln2hi - k*ln2lo
	p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720+r*(1.0/5040)))))))
	return p * math.Float32frombits(uint32(int32(k)+127)<<23)
}

// goExpSum is the portable ExpSum, summing in index order.
func goExpSum(dst, src []float32, scale, shift float32) float32 {
	dst = dst[:len(src)]
	var sum float32
	for i, x := range src {
		e := expf(x*scale - shift)
		dst[i] = e
		sum += e
	}
	return sum
}

// goGELU is the portable GELU.
func goGELU(out, dgelu, h []float32) {
	out, dgelu = out[:len(h)], dgelu[:len(h)]
	for i, v := range h {
		t := 1 - 2/(expf(2*geluC*(v+0.044715*v*v*v))+1)
		dgelu[i] = 0.5*(1+t) + 0.5*v*(1-t*t)*geluC*(1+3*0.044715*v*v)
		out[i] = 0.5 * v * (1 + t)
	}
}

// ExpSum writes dst[i] = exp(src[i]·scale - shift) for every i of src and
// returns their sum: the exponentials of a softmax with its maximum
// subtracted. Exponentials are within 3e-7 relative of exact for
// arguments in [-87, 88], which are clamped to that range; the sum is in
// float32, in an order that depends on the kernel but not on anything
// else. dst may be src. It panics when dst is shorter than src: that is a
// bug in the caller.
func (e *Engine) ExpSum(dst, src []float32, scale, shift float32) float32 {
	if len(dst) < len(src) {
		panic(fmt.Sprintf("kernels: ExpSum with len(dst)=%d < len(src)=%d", len(dst), len(src)))
	}
	return e.kern.expSum(dst, src, scale, shift)
}

// GELU computes GPT-2's tanh GELU of every element x = h[i] and its
// derivative, for the backward pass to multiply the output's gradient by
// (Mul): with t = tanh(sqrt(2/pi)·(x + 0.044715·x³)), out[i] =
// 0.5·x·(1 + t) and dgelu[i] = 0.5 (1 + t) + 0.5 x (1 - t²) sqrt(2/pi)
// (1 + 3·0.044715 x²). t is 1 - 2/(exp(2u)+1) with ExpSum's exponential,
// within 1e-6 absolute of tanh. out may be h. It panics when out or
// dgelu is shorter than h: that is a bug in the caller.
func (e *Engine) GELU(out, dgelu, h []float32) {
	if len(out) < len(h) || len(dgelu) < len(h) {
		panic(fmt.Sprintf("kernels: GELU with len(out)=%d len(dgelu)=%d < len(h)=%d", len(out), len(dgelu), len(h)))
	}
	e.kern.gelu(out, dgelu, h)
}

// Max returns the largest element of x: NaN if one is NaN, -Inf for an
// empty x.
func (e *Engine) Max(x []float32) float32 { return e.kern.max(x) }

// Scale multiplies every element of x by s.
func (e *Engine) Scale(x []float32, s float32) { e.kern.scale(x, s) }

// goMax is the portable Max.
func goMax(x []float32) float32 {
	mx := float32(math.Inf(-1))
	for _, v := range x {
		mx = max(mx, v)
	}
	return mx
}

// goScale is the portable Scale.
func goScale(x []float32, s float32) {
	for i := range x {
		x[i] *= s
	}
}
