package kernels

import "fmt"

// Causal attention's products. With a causal mask, row i of the scores S = q·kᵀ is needed
// only up to column i, and the probabilities P (and the score gradient dS) are 0 above the
// diagonal, so P·v needs row i of P only up to column i and Pᵀ·dy row i of Pᵀ only from
// column i. These products skip, tile by tile of the micro-kernel, the work the mask makes
// 0: about 40% of the full products' for a context of 128. They run on the calling goroutine
// (attention runs many heads side by side) and add only exact zeros' worth less than the
// full product, so each element is the full product's value summed in the same order.

// CausalScores computes C[i, j] = sum_p A[i, p]·B[j, p] for j <= i, for A and B t×d and C
// t×t, all row-major and contiguous: the lower triangle of A·Bᵀ. Elements of C above the
// diagonal are left unspecified (some are written, some not): the caller masks them. A
// BF16 Engine computes the full product. It panics when t or d is negative or a slice is
// shorter than its shape says: that is a bug in the caller.
func (e *Engine) CausalScores(c, a, b []float32, t, d int) {
	checkCausal("CausalScores", c, a, b, t, t, d, t*d, t*d)
	if e.bf != nil || t*t*d < e.minPacked {
		e.MatMul(c, a, b, t, t, d, false, true, false)
		return
	}
	kern := e.kern.forShape(t, t)
	e.bandProduct(kern, band{
		c: c, a: a, b: b, m: t, n: t, k: d, transB: true,
		cols: func(i1 int) int { return i1 },
		span: func(_, _ int) (int, int) { return 0, d },
	})
}

// CausalApply computes C = A·B for A t×t with A[i, j] = 0 for j > i (the causal mask; A
// must hold those zeros, as some are read), B t×n and C t×n, all row-major and contiguous. A
// BF16 Engine computes the full product. It panics when t or n is negative or a slice is
// shorter than its shape says: that is a bug in the caller.
func (e *Engine) CausalApply(c, a, b []float32, t, n int) {
	checkCausal("CausalApply", c, a, b, t, n, t, t*t, t*n)
	if e.bf != nil || t*n*t < e.minPacked {
		e.MatMul(c, a, b, t, n, t, false, false, false)
		return
	}
	kern := e.kern.forShape(t, n)
	e.bandProduct(kern, band{
		c: c, a: a, b: b, m: t, n: n, k: t,
		cols: func(int) int { return n },
		span: func(_, i1 int) (int, int) { return 0, i1 },
	})
}

// CausalApplyT computes C = Aᵀ·B for A t×t with A[i, j] = 0 for j > i (A must hold those
// zeros, as some are read), B t×n and C t×n, all row-major and contiguous. A BF16 Engine
// computes the full product. It panics when t or n is negative or a slice is shorter than
// its shape says: that is a bug in the caller.
func (e *Engine) CausalApplyT(c, a, b []float32, t, n int) {
	checkCausal("CausalApplyT", c, a, b, t, n, t, t*t, t*n)
	if e.bf != nil || t*n*t < e.minPacked {
		e.MatMul(c, a, b, t, n, t, true, false, false)
		return
	}
	kern := e.kern.forShape(t, n)
	e.bandProduct(kern, band{
		c: c, a: a, b: b, m: t, n: n, k: t, transA: true,
		cols: func(int) int { return n },
		span: func(i0, _ int) (int, int) { return i0, t },
	})
}

// checkCausal panics, naming op, when a dimension is negative or a slice is shorter than the
// m×n C and the aLen and bLen floats of A and B.
func checkCausal(op string, c, a, b []float32, m, n, k, aLen, bLen int) {
	if m < 0 || n < 0 || k < 0 || len(c) < m*n || len(a) < aLen || len(b) < bLen {
		panic(fmt.Sprintf("kernels: %s %dx%dx%d with len(a)=%d len(b)=%d len(c)=%d", op, m, n, k, len(a), len(b), len(c)))
	}
}

// band is a product C = op(A)·op(B) (m×n, op(A) m×k, op(B) k×n, all stored contiguous as in
// MatMul) of which each row tile i0..i1 needs only columns 0..cols(i1)-1 and only the terms
// p in span(i0, i1), the others being 0 or not wanted.
type band struct {
	c, a, b        []float32
	m, n, k        int
	transA, transB bool
	cols           func(i1 int) int
	span           func(i0, i1 int) (p0, p1 int)
}

// bandProduct computes the band pr with kern on the calling goroutine: it packs all of op(B)
// once, then runs the micro-kernel over each row tile's columns and terms, reading op(A)
// straight from A where the kernel can and packing it a tile at a time otherwise. Every C
// element it writes is the sum over its span in increasing p, as MatMul's one-block sum.
func (e *Engine) bandProduct(kern *microKernel, pr band) {
	mr, nr := kern.mr, kern.nr
	m, n, k := pr.m, pr.n, pr.k
	sb, sa := panelStride(nr, k), panelStride(mr, k)
	nPanels := ceilDiv(n, nr)
	bBuf, aBuf := getBuf(&e.packB, nPanels*sb), getBuf(&e.packA, sa+mr*nr)
	defer e.packB.Put(bBuf)
	defer e.packA.Put(aBuf)
	bp := aligned(*bBuf, nPanels*sb)
	buf := aligned(*aBuf, sa+mr*nr)
	ap, tile := buf[:sa], buf[sa:]
	kern.packB(bp, pr.b, n, k, 0, k, 0, n, sb, pr.transB)

	direct, aStride := kern.tileRows, k
	if pr.transA {
		direct, aStride = kern.tileCols, m
	}
	for i0 := 0; i0 < m; i0 += mr {
		i1 := min(i0+mr, m)
		// A last partial tile, when there is a whole tile's rows, runs as the tile of the
		// last mr rows, reading A directly; only its rows from i0 are kept. Its span may
		// start earlier, which adds only exact zeros of A (0 for j > i).
		first := i0
		if i1-i0 < mr && m >= mr && direct != nil {
			first = m - mr
		}
		p0, p1 := pr.span(first, i1)
		kc := p1 - p0
		if kc <= 0 {
			continue
		}
		full := i1-first == mr
		var aTile []float32 // op(A)'s rows first..i1, terms p0..p1, for direct
		switch {
		case full && direct != nil && pr.transA:
			aTile = pr.a[p0*m+first:]
		case full && direct != nil:
			aTile = pr.a[first*k+p0:]
		default:
			kern.packA(ap, pr.a, m, k, first, i1-first, p0, kc, sa, pr.transA)
		}
		for q := range ceilDiv(min(pr.cols(i1), n), nr) {
			j := q * nr
			nrb := min(nr, n-j)
			bq := bp[q*sb+p0*nr:][:nr*kc]
			out, ldc := pr.c[i0*n+j:], n
			edge := first != i0 || !full || nrb < nr
			if edge {
				out, ldc = tile, nr
			}
			if aTile != nil {
				direct(kc, aTile, aStride, bq, out, ldc, false)
			} else {
				kern.tile(kc, ap, bq, out, ldc, false)
			}
			if edge {
				for r := i0; r < i1; r++ {
					copy(pr.c[r*n+j:][:nrb], tile[(r-first)*nr:][:nrb])
				}
			}
		}
	}
}
