package model

import "github.com/gorun/gorun/trainer/kernels"

// lnEps is the variance floor of every layer norm (PyTorch's default).
const lnEps = 1e-5

// layerNormForward normalizes each of the n rows of x (width d) and applies the gain w and bias
// b: out = (x - mean) * rstd * w + b, with rstd = 1/sqrt(var + eps) (biased variance), by
// kernels.Engine.LayerNorm. It keeps mean and rstd per row for the backward pass. Rows run in
// parallel on p.
func layerNormForward(p pool, out, mean, rstd, x, w, b []float32, n, d int) {
	p.forRows(n, func(lo, hi int) {
		p.eng.LayerNorm(out[lo*d:hi*d], mean[lo:hi], rstd[lo:hi], x[lo*d:hi*d], w, b, d, lnEps)
	})
}

// layerNormBackward adds to dx, dw and db the gradient of a layer norm given dout, the gradient
// of its output, by kernels.Engine.LayerNormBackward on one goroutine (every row adds to dw and
// db). With xhat = (x - mean) * rstd and g = dout * w:
//
//	dw += sum over rows of dout * xhat
//	db += sum over rows of dout
//	dx += rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))
//
// the last line being the derivative through the row's mean and variance.
func layerNormBackward(eng *kernels.Engine, dx, dw, db, dout, x, mean, rstd, w []float32, n, d int) {
	eng.LayerNormBackward(dx[:n*d], dw, db, dout[:n*d], x[:n*d], mean[:n], rstd[:n], w, d)
}
