package trainer

import (
	"unsafe"

	"github.com/gorun/gorun/trainer/kernels"
)

// The step's gradient does not depend on the world size or the layout.
// The global batch is a fixed sequence of units of micro_batch samples
// (data.Batch.MicroFirst: which samples a unit holds depends only on its
// index), and a unit's gradient is the same bits wherever it is computed:
// Backward starts from a zeroed buffer, and the kernels never split a
// reduction over threads. Only the sum over units depends on the world:
// how many each rank adds locally, and the order in which the ranks' sums
// meet in the collectives. That sum is made in float64 (each unit's
// gradient reduced into it, hsdp.Groups.ReducePart and ReduceReplicas) and
// rounded to float32 once (roundMean), so the
// order almost never shows: float64 keeps about 29 bits more than float32,
// and a sum of a few float32 values of similar size is exact in it. In
// float32 the order did show, as rounding noise that AdamW (eps 1e-8)
// turns into steps of the learning rate's size where gradients are tiny.

// bufferChunk is how many elements one item of the per-step buffer work
// (zero) covers on the engine's
// threads: elementwise work, so any split gives the same bits.
const bufferChunk = 1 << 15

// roundMean rounds sum[i]/units to float32, the mean of the units'
// gradients, the step's gradient of the mean loss, and returns those
// float32s in sum's own memory: element i takes bytes [4i, 4i+4) of sum,
// which hold the float64 sum[i/2], already read. So the step's gradient
// costs no buffer beyond its float64 sum (whose values it destroys). It
// runs on one goroutine, in order: that is what makes the overlap safe.
// When units is a power of two it multiplies by 1/units instead: the
// reciprocal is exact, so the product is the quotient's bits.
func roundMean(sum []float64, units int) []float32 {
	if len(sum) == 0 {
		return nil
	}
	dst := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(sum))), len(sum))
	n := float64(units)
	if units&(units-1) == 0 {
		inv := 1 / n
		for i := range dst {
			dst[i] = float32(sum[i] * inv)
		}
		return dst
	}
	for i := range dst {
		dst[i] = float32(sum[i] / n)
	}
	return dst
}

// zero sets every element of x to zero, on e's threads.
func zero[T float32 | float64](e *kernels.Engine, x []T) {
	e.ForChunks(len(x), bufferChunk, func(lo, hi int) { clear(x[lo:hi]) })
}
