package model

// The MLP of a block is c_fc (d -> 4d), GELU, c_proj (4d -> d); its two linear layers use
// linearForward and linearBackward, and this file holds the activation.

// geluForward computes out = gelu(h) elementwise with the tanh approximation GPT-2 uses:
// gelu(h) = 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h³))), by kernels.Engine.GELU. It keeps the
// derivative gelu'(h) in dgelu for the backward pass, which then reads neither h nor the tanh.
// Chunks run in parallel on p.
func geluForward(p pool, out, dgelu, h []float32) {
	const chunk = 1024
	p.forRows((len(h)+chunk-1)/chunk, func(lo, hi int) {
		lo, hi = lo*chunk, min(hi*chunk, len(h))
		p.eng.GELU(out[lo:hi], dgelu[lo:hi], h[lo:hi])
	})
}

// geluBackward multiplies g (dL/dout on entry, dL/dh on return; n rows of width floats) by
// gelu'(h), kept in dgelu by geluForward. It also sums the columns of the result, the gradient
// of the bias of the layer before the GELU, while in cache: chunk i of rowChunk rows into
// part[i*width:], as chunkSum does (the caller adds the partial sums in chunk order). Chunks
// run in parallel on p.
func geluBackward(p pool, part, g, dgelu []float32, n, width int) {
	p.forEach(chunks(n), func(i int) {
		lo, hi := chunkRows(i, n)
		p.eng.Mul(g[lo*width:hi*width], dgelu[lo*width:hi*width])
		chunkSum(p.eng, part, g, i, n, width)
	})
}
