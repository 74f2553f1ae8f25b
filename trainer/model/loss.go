package model

import (
	"math"

	"github.com/gorun/gorun/trainer/kernels"
)

// crossEntropyForward turns the n rows of logits (width v) into probabilities in place (a
// softmax with the row maximum subtracted, exponentials by kernels.Engine.ExpSum) and returns the mean over rows of -log p[target].
// Rows run in parallel on p; each row's loss goes to rowLoss, summed in float64 in row order
// afterwards, so the result does not depend on the thread count.
func crossEntropyForward(p pool, logits []float32, rowLoss []float64, targets []byte, n, v int) float32 {
	p.forRows(n, func(lo, hi int) { crossEntropyRows(p.eng, logits, rowLoss, targets, lo, hi, v) })
	var total float64
	for _, l := range rowLoss[:n] {
		total += l
	}
	return float32(total / float64(n))
}

func crossEntropyRows(eng *kernels.Engine, logits []float32, rowLoss []float64, targets []byte, lo, hi, v int) {
	for i := lo; i < hi; i++ {
		row := logits[i*v : (i+1)*v]
		mx := eng.Max(row)
		tgt := int(targets[i])
		zt := float64(row[tgt] - mx)
		s := float64(eng.ExpSum(row, row, 1, mx))
		// log p[target] = (z_t - max) - log(sum): no log of an underflowed probability.
		rowLoss[i] = math.Log(s) - zt
		eng.Scale(row, float32(1/s))
	}
}

// crossEntropyBackward writes into dlogits the gradient of scale * mean loss with respect to
// the logits: (p - onehot(target)) * scale / n, where probs holds p from the forward pass.
// Rows run in parallel on p.
func crossEntropyBackward(p pool, dlogits, probs []float32, targets []byte, n, v int, scale float32) {
	k := scale / float32(n)
	p.forRows(n, func(lo, hi int) {
		d := dlogits[lo*v : hi*v]
		copy(d, probs[lo*v:hi*v])
		p.eng.Scale(d, k)
		for i := lo; i < hi; i++ {
			dlogits[i*v+int(targets[i])] -= k
		}
	})
}
