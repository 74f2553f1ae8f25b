package kernels

import (
	"fmt"
	"math"
)

// LayerNorm normalizes each row of d floats of x and applies the gain w
// and bias b (d floats each): out = (x - mean)·rstd·w + b, with mean and
// rstd = 1/sqrt(var + eps) (biased variance) of the row, which it keeps in
// mean and rstd (one per row) for LayerNormBackward. The rows are
// len(x)/d. It panics when d is not positive, len(x) is not a multiple of
// d, or another slice is shorter than that says: a bug in the caller.
func (e *Engine) LayerNorm(out, mean, rstd, x, w, b []float32, d int, eps float32) {
	rows := layerNormRows("LayerNorm", x, d)
	if len(out) < len(x) || len(mean) < rows || len(rstd) < rows || len(w) < d || len(b) < d {
		panic(fmt.Sprintf("kernels: LayerNorm of %d rows of %d with len(out)=%d len(mean)=%d len(rstd)=%d len(w)=%d len(b)=%d",
			rows, d, len(out), len(mean), len(rstd), len(w), len(b)))
	}
	e.kern.layerNorm(out, mean, rstd, x, w, b, rows, d, eps)
}

// LayerNormBackward adds to dx, dw and db (d floats each) the gradient of
// LayerNorm given dout, the gradient of its output, and the mean and rstd
// LayerNorm kept. With xhat = (x - mean)·rstd and g = dout·w:
//
//	dw += Σ over rows of dout·xhat
//	db += Σ over rows of dout
//	dx += rstd·(g - mean_j(g) - xhat·mean_j(g·xhat))
//
// It panics on shapes as LayerNorm does.
func (e *Engine) LayerNormBackward(dx, dw, db, dout, x, mean, rstd, w []float32, d int) {
	rows := layerNormRows("LayerNormBackward", x, d)
	if len(dx) < len(x) || len(dout) < len(x) || len(mean) < rows || len(rstd) < rows || len(w) < d || len(dw) < d || len(db) < d {
		panic(fmt.Sprintf("kernels: LayerNormBackward of %d rows of %d with len(dx)=%d len(dout)=%d len(mean)=%d len(rstd)=%d len(w)=%d len(dw)=%d len(db)=%d",
			rows, d, len(dx), len(dout), len(mean), len(rstd), len(w), len(dw), len(db)))
	}
	e.kern.layerNormBackward(dx, dw, db, dout, x, mean, rstd, w, rows, d)
}

// layerNormRows is the number of rows of d floats in x, or a panic naming
// op when that is not a whole positive number.
func layerNormRows(op string, x []float32, d int) int {
	if d < 1 || len(x)%d != 0 {
		panic(fmt.Sprintf("kernels: %s of len(x)=%d in rows of %d", op, len(x), d))
	}
	return len(x) / d
}

// goLayerNorm is the portable LayerNorm; it sums the statistics in
// float64.
func goLayerNorm(out, mean, rstd, x, w, b []float32, rows, d int, eps float32) {
	for i := range rows {
		row := x[i*d : (i+1)*d]
		var s float64
		for _, v := range row {
			s += float64(v)
		}
		mu := s / float64(d)
		var ss float64
		for _, v := range row {
			c := float64(v) - mu
			ss += c * c
		}
		r := 1 / math.Sqrt(ss/float64(d)+float64(eps))
		mean[i], rstd[i] = float32(mu), float32(r)
		o := out[i*d : (i+1)*d]
		for j, v := range row {
			o[j] = (v-float32(mu))*float32(r)*w[j] + b[j]
		}
	}
}

// goLayerNormBackward is the portable LayerNormBackward; it sums the
// row statistics in float64.
func goLayerNormBackward(dx, dw, db, dout, x, mean, rstd, w []float32, rows, d int) {
	for i := range rows {
		row := x[i*d : (i+1)*d]
		g := dout[i*d : (i+1)*d]
		mu, r := mean[i], rstd[i]
		var sg, sgx float64
		for j, v := range row {
			xhat := (v - mu) * r
			gw := g[j] * w[j]
			sg += float64(gw)
			sgx += float64(gw * xhat)
			dw[j] += g[j] * xhat
			db[j] += g[j]
		}
		mg, mgx := float32(sg/float64(d)), float32(sgx/float64(d))
		o := dx[i*d : (i+1)*d]
		for j, v := range row {
			xhat := (v - mu) * r
			o[j] += r * (g[j]*w[j] - mg - xhat*mgx)
		}
	}
}
