package kernels

import "fmt"

// Causal attention's products. With a causal mask, row i of the scores S = q·kᵀ is needed
// only up to column i, and the probabilities P (and the score gradient dS) are 0 above the
// diagonal, so P·v needs row i of P only up to column i and Pᵀ·dy row i of Pᵀ only from
// column i. These products skip, tile by tile of the micro-kernel, the work the mask makes
// 0: about 40% of the full products' for a context of 128. They run on the calling goroutine
// (attention runs many heads side by side) and add only exact zeros' worth less than the
// full product, so each element is the full product's value summed in the same order.

// Strided is a row-major matrix of which row i starts at Data[i*Stride]: a block of columns
// of a wider matrix, such as one head's columns of the attention's [n, 3d] projections.
type Strided struct {
	Data   []float32
	Stride int
}

// contiguous is the rows×cols matrix x as a Strided.
func contiguous(x []float32, cols int) Strided { return Strided{Data: x, Stride: cols} }

// CausalScores computes C[i, j] = sum_p A[i, p]·B[j, p] for j <= i, for A and B t×d and C
// t×t, all row-major and contiguous: the lower triangle of A·Bᵀ. Elements of C above the
// diagonal are left unspecified (some are written, some not): the caller masks them. A
// BF16 Engine computes the full product. It panics when t or d is negative or a slice is
// shorter than its shape says: that is a bug in the caller.
func (e *Engine) CausalScores(c, a, b []float32, t, d int) {
	e.CausalScoresStrided(contiguous(c, t), contiguous(a, d), contiguous(b, d), t, d)
}

// CausalScoresStrided is CausalScores on matrices whose rows are their Stride apart; a
// Stride shorter than a row panics.
func (e *Engine) CausalScoresStrided(c, a, b Strided, t, d int) {
	checkCausal("CausalScores", c, a, b, t, t, t, d, t, d)
	if e.bf != nil || t*t*d < e.minPacked {
		e.gatheredMatMul(c, a, b, t, t, d, false, true)
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
	e.CausalApplyStrided(contiguous(c, n), contiguous(a, t), contiguous(b, n), t, n)
}

// CausalApplyStrided is CausalApply on matrices whose rows are their Stride apart; a Stride
// shorter than a row panics.
func (e *Engine) CausalApplyStrided(c, a, b Strided, t, n int) {
	checkCausal("CausalApply", c, a, b, t, n, t, t, t, n)
	if e.bf != nil || t*n*t < e.minPacked {
		e.gatheredMatMul(c, a, b, t, n, t, false, false)
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
	e.CausalApplyTStrided(contiguous(c, n), contiguous(a, t), contiguous(b, n), t, n)
}

// CausalApplyTStrided is CausalApplyT on matrices whose rows are their Stride apart; a
// Stride shorter than a row panics.
func (e *Engine) CausalApplyTStrided(c, a, b Strided, t, n int) {
	checkCausal("CausalApplyT", c, a, b, t, n, t, t, t, n)
	if e.bf != nil || t*n*t < e.minPacked {
		e.gatheredMatMul(c, a, b, t, n, t, true, false)
		return
	}
	kern := e.kern.forShape(t, n)
	e.bandProduct(kern, band{
		c: c, a: a, b: b, m: t, n: n, k: t, transA: true,
		cols: func(int) int { return n },
		span: func(i0, _ int) (int, int) { return i0, t },
	})
}

// checkCausal panics, naming op, when a dimension is negative, or a Stride is shorter than
// its row or a slice than its rows, for the m×n C, A of aRows×aCols and B of bRows×bCols.
func checkCausal(op string, c, a, b Strided, m, n, aRows, aCols, bRows, bCols int) {
	if m < 0 || n < 0 || aCols < 0 || bCols < 0 || !holds(c, m, n) || !holds(a, aRows, aCols) || !holds(b, bRows, bCols) {
		panic(fmt.Sprintf("kernels: %s %dx%d with A %dx%d (stride %d, len %d), B %dx%d (stride %d, len %d), C stride %d len %d",
			op, m, n, aRows, aCols, a.Stride, len(a.Data), bRows, bCols, b.Stride, len(b.Data), c.Stride, len(c.Data)))
	}
}

// holds reports whether x holds a rows×cols matrix.
func holds(x Strided, rows, cols int) bool {
	return x.Stride >= cols && (rows == 0 || len(x.Data) >= (rows-1)*x.Stride+cols)
}

// gatheredMatMul computes the whole C = op(A)·op(B) with MatMul (m×n, k terms), through
// contiguous copies of the matrices that are not contiguous.
func (e *Engine) gatheredMatMul(c, a, b Strided, m, n, k int, transA, transB bool) {
	aRows, aCols := m, k
	if transA {
		aRows, aCols = k, m
	}
	bRows, bCols := k, n
	if transB {
		bRows, bCols = n, k
	}
	av, aBuf := e.gather(a, aRows, aCols)
	bv, bBuf := e.gather(b, bRows, bCols)
	cv, cBuf := c.Data, (*[]float32)(nil)
	if c.Stride != n {
		cBuf = getBuf(&e.packB, m*n)
		cv = (*cBuf)[:m*n]
	}
	e.MatMul(cv, av, bv, m, n, k, transA, transB, false)
	if c.Stride != n {
		for i := range m {
			copy(c.Data[i*c.Stride:][:n], cv[i*n:][:n])
		}
	}
	for _, buf := range []*[]float32{aBuf, bBuf, cBuf} {
		if buf != nil {
			e.packB.Put(buf)
		}
	}
}

// gather returns x's rows×cols matrix contiguous: x's own data when its rows are
// contiguous, else a copy in a buffer from e.packB, which it returns too.
func (e *Engine) gather(x Strided, rows, cols int) ([]float32, *[]float32) {
	if x.Stride == cols {
		return x.Data, nil
	}
	buf := getBuf(&e.packB, rows*cols)
	g := (*buf)[:rows*cols]
	for i := range rows {
		copy(g[i*cols:][:cols], x.Data[i*x.Stride:][:cols])
	}
	return g, buf
}

// band is a product C = op(A)·op(B) (m×n, op(A) m×k, op(B) k×n, stored as in MatMul but
// with rows their Stride apart) of which each row tile i0..i1 needs only columns
// 0..cols(i1)-1 and only the terms p in span(i0, i1), the others being 0 or not wanted.
type band struct {
	c, a, b        Strided
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
	packPanels(kern, kern.nr, bp, pr.b, n, k, 0, 0, sb, pr.transB)

	direct, lda, ldc := kern.tileRows, pr.a.Stride, pr.c.Stride
	if pr.transA {
		direct = kern.tileCols
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
			aTile = pr.a.Data[p0*lda+first:]
		case full && direct != nil:
			aTile = pr.a.Data[first*lda+p0:]
		default:
			packPanels(kern, kern.mr, ap, pr.a, i1-first, kc, first, p0, sa, !pr.transA)
		}
		for q := range ceilDiv(min(pr.cols(i1), n), nr) {
			j := q * nr
			nrb := min(nr, n-j)
			bq := bp[q*sb+p0*nr:][:nr*kc]
			out := pr.c.Data[i0*ldc+j:]
			edge := first != i0 || !full || nrb < nr
			if edge {
				out = tile
			}
			outStride := ldc
			if edge {
				outStride = nr
			}
			if aTile != nil {
				direct(kc, aTile, lda, bq, out, outStride, false)
			} else {
				kern.tile(kc, ap, bq, out, outStride, false)
			}
			if edge {
				for r := i0; r < i1; r++ {
					copy(pr.c.Data[r*ldc+j:][:nrb], tile[(r-first)*nr:][:nrb])
				}
			}
		}
	}
}

// packPanels packs a cols×depth block of a matrix op(X) (its columns c0.., terms p0..) into
// panels of w columns, stride floats apart, each depth rows of w floats, columns past cols
// in the last panel zero: op(B) for the micro-kernel (transposed false: op(X) = X, whose
// rows are the terms; true: op(X) = Xᵀ), or op(A) seen as its transpose. It reads x at its
// Stride, with kern's copy and transpose routines for whole panels.
func packPanels(kern *microKernel, w int, dst []float32, x Strided, cols, depth, c0, p0, stride int, transposed bool) {
	whole := cols / w
	ld := x.Stride
	if transposed {
		// Column c of op(X) is row c of X: a contiguous run of terms.
		for q := range whole {
			kern.packTranspose(dst[q*stride:], x.Data[(c0+q*w)*ld+p0:], w, ld, depth)
		}
	} else {
		kern.packCopy(dst, x.Data[p0*ld+c0:], w, ld, depth, whole, stride)
	}
	last := cols - whole*w
	if last == 0 {
		return
	}
	d, cl := dst[whole*stride:][:w*depth], c0+whole*w
	clear(d)
	for c := range last {
		for p := range depth {
			if transposed {
				d[p*w+c] = x.Data[(cl+c)*ld+p0+p]
			} else {
				d[p*w+c] = x.Data[(p0+p)*ld+cl+c]
			}
		}
	}
}
