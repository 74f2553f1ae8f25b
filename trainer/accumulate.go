package trainer

// The step's gradient does not depend on the world size or the layout.
// The global batch is a fixed sequence of units of micro_batch samples
// (data.Batch.MicroFirst: which samples a unit holds depends only on its
// index), and a unit's gradient is the same bits wherever it is computed:
// Backward starts from a zeroed buffer, and the kernels never split a
// reduction over threads. Only the sum over units depends on the world:
// how many each rank adds locally, and the order in which the ranks' sums
// meet in the collectives. That sum is made in float64 (accumulate, then
// hsdp.Groups.ReduceGrads) and rounded to float32 once (roundMean), so the
// order almost never shows: float64 keeps about 29 bits more than float32,
// and a sum of a few float32 values of similar size is exact in it. In
// float32 the order did show, as rounding noise that AdamW (eps 1e-8)
// turns into steps of the learning rate's size where gradients are tiny.

// accumulate adds unit to sum element-wise, in float64.
func accumulate(sum []float64, unit []float32) {
	sum = sum[:len(unit)]
	for i, g := range unit {
		sum[i] += float64(g)
	}
}

// roundMean sets dst[i] to sum[i]/units rounded to float32: the mean of
// the units' gradients, the step's gradient of the mean loss.
func roundMean(dst []float32, sum []float64, units int) {
	sum = sum[:len(dst)]
	n := float64(units)
	for i, s := range sum {
		dst[i] = float32(s / n)
	}
}
