package model

import "math"

// lnEps is the variance floor of every layer norm (PyTorch's default).
const lnEps = 1e-5

// layerNormForward normalizes each of the n rows of x (width d) and applies the gain w and bias
// b: out = (x - mean) * rstd * w + b, with rstd = 1/sqrt(var + eps) (biased variance). It keeps
// mean and rstd per row for the backward pass. Statistics are summed in float64. Rows run in
// parallel on p.
func layerNormForward(p pool, out, mean, rstd, x, w, b []float32, n, d int) {
	p.forRows(n, func(lo, hi int) { layerNormRows(out, mean, rstd, x, w, b, lo, hi, d) })
}

func layerNormRows(out, mean, rstd, x, w, b []float32, lo, hi, d int) {
	for i := lo; i < hi; i++ {
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
		r := 1 / math.Sqrt(ss/float64(d)+lnEps)
		mean[i], rstd[i] = float32(mu), float32(r)
		o := out[i*d : (i+1)*d]
		for j, v := range row {
			o[j] = (v-float32(mu))*float32(r)*w[j] + b[j]
		}
	}
}

// layerNormBackward adds to dx, dw and db the gradient of a layer norm given dout, the gradient
// of its output. With xhat = (x - mean) * rstd and g = dout * w:
//
//	dw += sum over rows of dout * xhat
//	db += sum over rows of dout
//	dx += rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))
//
// the last line being the derivative through the row's mean and variance.
func layerNormBackward(dx, dw, db, dout, x, mean, rstd, w []float32, n, d int) {
	for i := 0; i < n; i++ {
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
