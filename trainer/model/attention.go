package model

import (
	"math"

	"github.com/gorun/gorun/trainer/kernels"
)

// Causal multi-head self-attention. The c_attn projection (d -> 3d) and c_proj (d -> d) are
// linear layers; this file holds the part between them. Per (sequence, head) pair, with
// q, k, v the [T, hd] slices of that head and s = 1/sqrt(hd):
//
//	S = s · q·kᵀ           [T, T]
//	P = softmax over j <= i of S[i, j], and P[i, j] = 0 for j > i (the causal mask)
//	y = P·v                [T, hd]
//
// Every pair is independent, so pairs are spread over goroutines; each pair's result is
// computed by one goroutine in a fixed order, so the bits do not depend on scheduling.

// dims are the sizes of one micro-batch.
type dims struct {
	b, t, d, h, hd, v int
	n                 int // b*t rows
}

// toHeads copies the d-wide block starting at column off of src ([n, stride]) into dst laid
// out [b, h, t, hd], one contiguous [t, hd] matrix per (sequence, head); sequences run in
// parallel on p.
func toHeads(p pool, dst, src []float32, stride, off int, dm dims) {
	p.forEach(dm.b, func(bi int) {
		for ti := 0; ti < dm.t; ti++ {
			row := src[(bi*dm.t+ti)*stride+off:]
			for hi := 0; hi < dm.h; hi++ {
				o := ((bi*dm.h+hi)*dm.t + ti) * dm.hd
				copy(dst[o:o+dm.hd], row[hi*dm.hd:(hi+1)*dm.hd])
			}
		}
	})
}

// fromHeads is the inverse of toHeads: it copies src laid out [b, h, t, hd] into the d-wide
// block starting at column off of dst ([n, stride]); sequences run in parallel on p.
func fromHeads(p pool, dst, src []float32, stride, off int, dm dims) {
	p.forEach(dm.b, func(bi int) {
		for ti := 0; ti < dm.t; ti++ {
			row := dst[(bi*dm.t+ti)*stride+off:]
			for hi := 0; hi < dm.h; hi++ {
				o := ((bi*dm.h+hi)*dm.t + ti) * dm.hd
				copy(row[hi*dm.hd:(hi+1)*dm.hd], src[o:o+dm.hd])
			}
		}
	})
}

// attentionForward computes y (laid out [b, h, t, hd]) from q, k, v (same layout) and keeps
// the probabilities P in att ([b, h, t, t]) for the backward pass. The products skip what the
// causal mask makes 0 (kernels.Engine.CausalScores and CausalApply).
func attentionForward(p pool, y, att, q, k, v []float32, dm dims) {
	t, hd := dm.t, dm.hd
	scale := float32(1 / math.Sqrt(float64(hd)))
	p.forEach(dm.b*dm.h, func(i int) {
		m := i * t * hd
		qi, ki, vi := q[m:m+t*hd], k[m:m+t*hd], v[m:m+t*hd]
		pi := att[i*t*t : (i+1)*t*t]
		p.eng.CausalScores(pi, qi, ki, t, hd) // q·kᵀ, lower triangle
		for r := range t {
			softmaxRow(p.eng, pi[r*t:(r+1)*t], r+1, scale)
		}
		p.eng.CausalApply(y[m:m+t*hd], pi, vi, t, hd) // P·v
	})
}

// softmaxVector is the length the softmax of a row rounds its live elements up to, so the
// vector kernels (16 or 8 lanes) leave no elements to their scalar tails.
const softmaxVector = 16

// softmaxRow turns row, of which the first live elements are unmasked scores, into the
// probabilities softmax(scale · row[:live]) followed by zeros. The masked elements up to the
// next multiple of softmaxVector are set to -Inf and go through the kernels with the live
// ones: their exponential is clamped to about 1e-38, which does not change a sum of at least
// 1 (the largest score's term) by more than its last bit, and they are zeroed afterwards.
func softmaxRow(eng *kernels.Engine, row []float32, live int, scale float32) {
	span := row[:min((live+softmaxVector-1)/softmaxVector*softmaxVector, len(row))]
	for j := live; j < len(span); j++ {
		span[j] = float32(math.Inf(-1))
	}
	// scale > 0, so the largest scaled score is the largest score scaled (rounding is
	// monotonic).
	mx := eng.Max(span) * scale
	eng.Scale(span, 1/eng.ExpSum(span, span, scale, mx))
	clear(row[live:])
}

// attentionBackward takes dy = dL/dy ([b, h, t, hd]) and writes dq, dk, dv. dp ([b, h, t, t])
// is scratch. Per pair:
//
//	dP = dy·vᵀ,  dv = Pᵀ·dy
//	dS[i, j] = s · P[i, j] (dP[i, j] - sum_k P[i, k] dP[i, k])   (softmax backward; 0 where masked)
//	dq = dS·k,   dk = dSᵀ·q
//
// dP is needed, and computed, only on and below the diagonal.
func attentionBackward(p pool, dq, dk, dv, dp, dy, att, q, k, v []float32, dm dims) {
	t, hd := dm.t, dm.hd
	scale := float32(1 / math.Sqrt(float64(hd)))
	p.forEach(dm.b*dm.h, func(i int) {
		m := i * t * hd
		qi, ki, vi, dyi := q[m:m+t*hd], k[m:m+t*hd], v[m:m+t*hd], dy[m:m+t*hd]
		pi, dpi := att[i*t*t:(i+1)*t*t], dp[i*t*t:(i+1)*t*t]
		p.eng.CausalScores(dpi, dyi, vi, t, hd)          // dP = dy·vᵀ
		p.eng.CausalApplyT(dv[m:m+t*hd], pi, dyi, t, hd) // dv = Pᵀ·dy
		for r := range t {
			softmaxBackwardRow(dpi[r*t:(r+1)*t], pi[r*t:(r+1)*t], r+1, scale)
		}
		p.eng.CausalApply(dq[m:m+t*hd], dpi, ki, t, hd)  // dq = dS·k
		p.eng.CausalApplyT(dk[m:m+t*hd], dpi, qi, t, hd) // dk = dSᵀ·q
	})
}

// softmaxBackwardRow turns row d of dP into row dS, given row pr of P of which the first live
// elements are unmasked: d[j] = scale · pr[j] (d[j] - sum_k pr[k] d[k]) for j < live, and 0
// past it. The sum runs in eight interleaved float32 partial sums, in a fixed order.
func softmaxBackwardRow(d, pr []float32, live int, scale float32) {
	pr, dl := pr[:live], d[:live]
	var s0, s1, s2, s3, s4, s5, s6, s7 float32
	j := 0
	for ; j+8 <= live; j += 8 {
		p, x := pr[j:j+8:j+8], dl[j:j+8:j+8]
		s0 += p[0] * x[0]
		s1 += p[1] * x[1]
		s2 += p[2] * x[2]
		s3 += p[3] * x[3]
		s4 += p[4] * x[4]
		s5 += p[5] * x[5]
		s6 += p[6] * x[6]
		s7 += p[7] * x[7]
	}
	for ; j < live; j++ {
		s0 += pr[j] * dl[j]
	}
	s := ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
	for j, p := range pr {
		dl[j] = scale * p * (dl[j] - s)
	}
	clear(d[live:])
}
