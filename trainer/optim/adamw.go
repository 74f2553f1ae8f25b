package optim

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/trainer/kernels"
)

// State is the AdamW state of one slice of the parameters: the first and second moments, one
// value per parameter, and the number of updates done so far. It is plain data, so a
// checkpoint saves M and V like parameters and Step as an integer.
type State struct {
	M, V []float32
	Step int
}

// NewState returns the zero state for n parameters.
func NewState(n int) State {
	return State{M: make([]float32, n), V: make([]float32, n)}
}

// SumSquares returns the sum of the squares of g in float64, in the fixed
// order of kernels.Engine.SumSquares (chunks of e's threads, the same bits
// on any number of them). Each rank computes it over the gradient slice
// it owns; the sum over ranks is the square of the global norm that
// ClipFactor takes.
func SumSquares(e *kernels.Engine, g []float32) float64 {
	return e.SumSquares(g)
}

// ClipFactor returns the factor that scales the gradients so that their global norm,
// sqrt(sumSquares), is at most maxNorm: maxNorm/(norm+1e-6) when the norm exceeds maxNorm (as
// torch.nn.utils.clip_grad_norm_ does), else 1. maxNorm <= 0 disables clipping. A norm that is
// not finite gives NaN, so the update poisons the parameters visibly instead of silently.
func ClipFactor(sumSquares, maxNorm float64) float32 {
	norm := math.Sqrt(sumSquares)
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		return float32(math.NaN())
	}
	if maxNorm <= 0 || norm <= maxNorm {
		return 1
	}
	return float32(maxNorm / (norm + 1e-6))
}

// Update applies one AdamW step to params, the slice of the flat buffer that this rank owns,
// from grads (same slice), multiplied by clip (see ClipFactor), and returns the learning rate it
// used, c.LRAt(st.Step). The elements in the spans of decay get weight decay (see
// model.Layout.DecaySpans); none means no decay anywhere. Per element, in float64, with
// t = st.Step+1 and lr the scheduled rate, each operation rounded on its own (no fused
// multiply-add):
//
//	g = clip * grad
//	p -= lr * WeightDecay * p            (decoupled decay, only in decay's spans: p *= 1 - lr*WeightDecay)
//	m = Beta1 m + (1-Beta1) g
//	v = Beta2 v + ((1-Beta2) g) g
//	p -= lr * (m / (1-Beta1^t)) / (sqrt(v / (1-Beta2^t)) + Eps)
//
// The update runs on e (kernels.Engine.AdamW): vector instructions where the CPU has them,
// split over e's threads. Elements are independent and every kernel computes exactly this, so
// any split of the buffer over ranks or threads gives the same bits.
//
// With keep's buffers set, the update first copies params, st.M and st.V as they were into them
// (kernels.Engine.AdamWKeeping: keep.Params may be grads' own memory, which the copy then
// overwrites); with keep's zero value it keeps nothing and leaves grads unchanged. Update
// returns an error, changing nothing, when the lengths of params, grads, st.M and st.V (and
// keep's, when set) differ, or decay's spans are not sorted, disjoint and within params.
func Update(e *kernels.Engine, c Config, st *State, params, grads []float32, decay []kernels.Span, clip float32, keep kernels.Kept) (float64, error) {
	n := len(params)
	if len(grads) != n || len(st.M) != n || len(st.V) != n {
		return 0, fmt.Errorf("optim: update: lengths differ: params %d, grads %d, m %d, v %d",
			n, len(grads), len(st.M), len(st.V))
	}
	keeping := keep.Params != nil || keep.M != nil || keep.V != nil
	if keeping && (len(keep.Params) != n || len(keep.M) != n || len(keep.V) != n) {
		return 0, fmt.Errorf("optim: update: the copy's lengths differ from params %d: %d, %d, %d",
			n, len(keep.Params), len(keep.M), len(keep.V))
	}
	if err := kernels.CheckSpans(decay, n); err != nil {
		return 0, fmt.Errorf("optim: update: weight decay: %w", err)
	}
	lr := c.LRAt(st.Step)
	st.Step++
	t := float64(st.Step)
	step := kernels.AdamWStep{LR: lr, Beta1: c.Beta1, Beta2: c.Beta2, Eps: c.Eps, Shrink: 1 - lr*c.WeightDecay,
		BC1: 1 - math.Pow(c.Beta1, t), BC2: 1 - math.Pow(c.Beta2, t), Clip: float64(clip)}
	if keeping {
		e.AdamWKeeping(params, st.M, st.V, grads, keep, decay, step)
	} else {
		e.AdamW(params, st.M, st.V, grads, decay, step)
	}
	return lr, nil
}
