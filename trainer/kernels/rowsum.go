package kernels

import "fmt"

// Add adds src to dst elementwise: dst[i] += src[i] for every i of src.
// Each element is one rounded addition, so every kernel gives the same
// bits. It panics when dst is shorter than src: that is a bug in the
// caller.
func (e *Engine) Add(dst, src []float32) {
	if len(dst) < len(src) {
		panic(fmt.Sprintf("kernels: Add with len(dst)=%d < len(src)=%d", len(dst), len(src)))
	}
	e.kern.add(dst, src)
}

// Mul multiplies dst by src elementwise: dst[i] *= src[i] for every i of
// src, one rounded product each, so every kernel gives the same bits: the
// backward pass of an elementwise function whose derivative the forward
// pass kept (GELU's dgelu). It panics when dst is shorter than src: that
// is a bug in the caller.
func (e *Engine) Mul(dst, src []float32) {
	if len(dst) < len(src) {
		panic(fmt.Sprintf("kernels: Mul with len(dst)=%d < len(src)=%d", len(dst), len(src)))
	}
	e.kern.mul(dst, src)
}

// SumRows adds to dst[:cols] the rows of src, len(src)/cols rows of cols
// floats: dst[j] += src[j] + src[cols+j] + ..., each column added to
// dst[j] one row at a time in row order, so every kernel gives the same
// bits. It is the column sums of a bias gradient, and the sum of
// per-chunk partial sums in chunk order. It panics when cols is not
// positive, len(src) is not a multiple of cols or dst is shorter than
// cols: that is a bug in the caller.
func (e *Engine) SumRows(dst, src []float32, cols int) {
	if cols < 1 || len(src)%cols != 0 || len(dst) < cols {
		panic(fmt.Sprintf("kernels: SumRows of len(src)=%d in rows of %d into len(dst)=%d", len(src), cols, len(dst)))
	}
	e.kern.sumRows(dst[:cols], src, len(src)/cols, cols)
}

// goAdd is the portable Add.
func goAdd(dst, src []float32) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] += v
	}
}

// goMul is the portable Mul.
func goMul(dst, src []float32) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] *= v
	}
}

// goSumRows is the portable SumRows of rows rows of cols floats.
func goSumRows(dst, src []float32, rows, cols int) {
	dst = dst[:cols]
	for i := range rows {
		for j, v := range src[i*cols:][:cols] {
			dst[j] += v
		}
	}
}
