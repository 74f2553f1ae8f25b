package model

import "math"

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
		p.eng.CausalSoftmax(pi, t, scale)
		p.eng.CausalApply(y[m:m+t*hd], pi, vi, t, hd) // P·v
	})
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
		p.eng.CausalSoftmaxBackward(dpi, pi, t, scale)   // dS
		p.eng.CausalApply(dq[m:m+t*hd], dpi, ki, t, hd)  // dq = dS·k
		p.eng.CausalApplyT(dk[m:m+t*hd], dpi, qi, t, hd) // dk = dSᵀ·q
	})
}
