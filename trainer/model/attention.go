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
// computed by one goroutine in a fixed order, so the bits do not depend on scheduling. q, k
// and v are read, and y and the gradients written, in the [n, d]-wide layouts of the linear
// layers: no copies into a per-head layout.

// dims are the sizes of one micro-batch.
type dims struct {
	b, t, d, h, hd, v int
	n                 int // b*t rows
}

// head is the [t, hd] matrix of head hi of sequence bi in x ([n, stride]), whose heads'
// columns start at column off: it is read and written in place, rows stride apart.
func head(x []float32, stride, off, bi, hi int, dm dims) kernels.Strided {
	return kernels.Strided{Data: x[bi*dm.t*stride+off+hi*dm.hd:], Stride: stride}
}

// attentionForward computes y ([n, d], heads side by side as c_proj reads them) from q, k
// and v, the column blocks 0, d and 2d of qkv ([n, 3d], as c_attn writes them), and keeps
// the probabilities P in att ([b, h, t, t]) for the backward pass. The products read and
// write each head's columns in place and skip what the causal mask makes 0
// (kernels.Engine.CausalScoresStrided and CausalApplyStrided).
func attentionForward(p pool, y, att, qkv []float32, dm dims) {
	t, hd, d := dm.t, dm.hd, dm.d
	scale := float32(1 / math.Sqrt(float64(hd)))
	p.forEach(dm.b*dm.h, func(i int) {
		bi, hi := i/dm.h, i%dm.h
		q, k, v := head(qkv, 3*d, 0, bi, hi, dm), head(qkv, 3*d, d, bi, hi, dm), head(qkv, 3*d, 2*d, bi, hi, dm)
		pi := att[i*t*t : (i+1)*t*t]
		ps := kernels.Strided{Data: pi, Stride: t}
		p.eng.CausalScoresStrided(ps, q, k, t, hd) // q·kᵀ, lower triangle
		p.eng.CausalSoftmax(pi, t, scale)
		p.eng.CausalApplyStrided(head(y, d, 0, bi, hi, dm), ps, v, t, hd) // P·v
	})
}

// attentionBackward takes dy = dL/dy ([n, d]) and writes dq, dk and dv into the column
// blocks 0, d and 2d of dqkv ([n, 3d]), from q, k and v in qkv as attentionForward read
// them. dp ([b, h, t, t]) is scratch. Per (sequence, head) pair:
//
//	dP = dy·vᵀ,  dv = Pᵀ·dy
//	dS[i, j] = s · P[i, j] (dP[i, j] - sum_k P[i, k] dP[i, k])   (softmax backward; 0 where masked)
//	dq = dS·k,   dk = dSᵀ·q
//
// dP is needed, and computed, only on and below the diagonal.
func attentionBackward(p pool, dqkv, dp, dy, att, qkv []float32, dm dims) {
	t, hd, d := dm.t, dm.hd, dm.d
	scale := float32(1 / math.Sqrt(float64(hd)))
	p.forEach(dm.b*dm.h, func(i int) {
		bi, hi := i/dm.h, i%dm.h
		q, k, v := head(qkv, 3*d, 0, bi, hi, dm), head(qkv, 3*d, d, bi, hi, dm), head(qkv, 3*d, 2*d, bi, hi, dm)
		dq, dk, dv := head(dqkv, 3*d, 0, bi, hi, dm), head(dqkv, 3*d, d, bi, hi, dm), head(dqkv, 3*d, 2*d, bi, hi, dm)
		dyi := head(dy, d, 0, bi, hi, dm)
		pi, dpi := att[i*t*t:(i+1)*t*t], dp[i*t*t:(i+1)*t*t]
		ps, dps := kernels.Strided{Data: pi, Stride: t}, kernels.Strided{Data: dpi, Stride: t}
		p.eng.CausalScoresStrided(dps, dyi, v, t, hd)  // dP = dy·vᵀ
		p.eng.CausalApplyTStrided(dv, ps, dyi, t, hd)  // dv = Pᵀ·dy
		p.eng.CausalSoftmaxBackward(dpi, pi, t, scale) // dS
		p.eng.CausalApplyStrided(dq, dps, k, t, hd)    // dq = dS·k
		p.eng.CausalApplyTStrided(dk, dps, q, t, hd)   // dk = dSᵀ·q
	})
}
