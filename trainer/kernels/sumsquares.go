package kernels

// sumSquaresChunk is how many elements one partial sum of SumSquares
// covers; a multiple of its 8 interleaved sums.
const sumSquaresChunk = 1 << 14

// SumSquares returns the sum of the squares of x in float64, in an order
// that depends only on len(x): chunks of 16384 elements, each summed as 8
// interleaved partial sums (element i into sum i mod 8, combined
// pairwise), the chunks' sums added in index order. The chunks run on the
// Engine's threads; the result does not depend on their number.
func (e *Engine) SumSquares(x []float32) float64 {
	chunks := ceilDiv(len(x), sumSquaresChunk)
	if chunks <= 1 {
		return sumSquares8(x)
	}
	partial := make([]float64, chunks)
	e.ForChunks(len(x), sumSquaresChunk, func(lo, hi int) {
		partial[lo/sumSquaresChunk] = sumSquares8(x[lo:hi])
	})
	var s float64
	for _, p := range partial {
		s += p
	}
	return s
}

// sumSquares8 is the sum of the squares of x as 8 interleaved partial
// sums, element i into sum i mod 8, combined pairwise: independent
// chains, so the adds do not wait on each other. The last len(x) mod 8
// elements go in as a group padded with zeros, which add nothing.
func sumSquares8(x []float32) float64 {
	var s0, s1, s2, s3, s4, s5, s6, s7 float64
	add := func(v []float32) {
		v = v[:8:8]
		a0, a1, a2, a3 := float64(v[0]), float64(v[1]), float64(v[2]), float64(v[3])
		a4, a5, a6, a7 := float64(v[4]), float64(v[5]), float64(v[6]), float64(v[7])
		s0 += float64(a0 * a0)
		s1 += float64(a1 * a1)
		s2 += float64(a2 * a2)
		s3 += float64(a3 * a3)
		s4 += float64(a4 * a4)
		s5 += float64(a5 * a5)
		s6 += float64(a6 * a6)
		s7 += float64(a7 * a7)
	}
	whole := len(x) / 8 * 8
	for i := 0; i < whole; i += 8 {
		add(x[i:])
	}
	if whole < len(x) {
		var tail [8]float32
		copy(tail[:], x[whole:])
		add(tail[:])
	}
	return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
}
