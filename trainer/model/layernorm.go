package model

// lnEps is the variance floor of every layer norm (PyTorch's default).
const lnEps = 1e-5

// addLayerNorm adds res to x (when res is not nil: the residual connection that completes x),
// then normalizes each of the n rows of x (width d) into a.out and applies the gain w and bias
// b: out = (x - mean) * rstd * w + b, with rstd = 1/sqrt(var + eps) (biased variance), by
// kernels.Engine.LayerNorm. It keeps mean and rstd per row in a for the backward pass. Rows run
// in parallel on p, rowChunk rows at a time, each added and normalized while in cache.
func addLayerNorm(p pool, a normActs, x, res, w, b []float32, n, d int) {
	p.forRows(n, func(lo, hi int) {
		for c := lo; c < hi; c += rowChunk {
			e := min(c+rowChunk, hi)
			if res != nil {
				p.eng.Add(x[c*d:e*d], res[c*d:e*d])
			}
			p.eng.LayerNorm(a.out[c*d:e*d], a.mean[c:e], a.rstd[c:e], x[c*d:e*d], w, b, d, lnEps)
		}
	})
}

// layerNormBackward adds to dx, dw and db the gradient of a layer norm given dout, the gradient
// of its output, by kernels.Engine.LayerNormBackward on chunks of rowChunk rows in parallel on
// p: each chunk adds to its own rows of dx and sums its dw and db into its partial sums in part
// (at least 3·chunks(n)·d floats), which are then added to dw and db in chunk order. Each chunk
// also sums the columns of its rows of dx as they come out, as chunkSum does, into
// dxSums(part, n, d): dx is the gradient of the output of the linear layer before, and these
// are the partial sums of that layer's bias gradient. When fresh, dx holds no gradient yet and
// each chunk clears its rows first. With xhat = (x - mean) * rstd and
// g = dout * w:
//
//	dw += sum over rows of dout * xhat
//	db += sum over rows of dout
//	dx += rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))
//
// the last line being the derivative through the row's mean and variance.
func layerNormBackward(p pool, part, dx, dw, db, dout, x, mean, rstd, w []float32, n, d int, fresh bool) {
	c := chunks(n)
	pw, pb := part[:c*d], part[c*d:2*c*d]
	p.forEach(c, func(i int) {
		lo, hi := chunkRows(i, n)
		cw, cb := pw[i*d:(i+1)*d], pb[i*d:(i+1)*d]
		clear(cw)
		clear(cb)
		if fresh {
			clear(dx[lo*d : hi*d])
		}
		p.eng.LayerNormBackward(dx[lo*d:hi*d], cw, cb, dout[lo*d:hi*d], x[lo*d:hi*d], mean[lo:hi], rstd[lo:hi], w, d)
		chunkSum(p.eng, dxSums(part, n, d), dx, i, n, d)
	})
	p.eng.SumRows(dw, pw, d)
	p.eng.SumRows(db, pb, d)
}

// dxSums is the part of part where layerNormBackward leaves the partial column sums of dx, one
// row of d floats per chunk.
func dxSums(part []float32, n, d int) []float32 {
	c := chunks(n)
	return part[2*c*d : 3*c*d]
}
