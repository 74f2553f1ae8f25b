package optim

import (
	"fmt"
	"math"
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

// SumSquares returns the sum of the squares of g, added in float64 in index order. Each rank
// computes it over the gradient slice it owns; the sum over ranks is the square of the global
// norm that ClipFactor takes.
func SumSquares(g []float32) float64 {
	var s float64
	for _, v := range g {
		s += float64(v) * float64(v)
	}
	return s
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
// used, c.LRAt(st.Step). decay[i] says whether params[i] gets weight decay (see
// model.Layout.DecayMask); nil means no decay anywhere. Per element, in float64, with
// t = st.Step+1 and lr the scheduled rate:
//
//	g = clip * grad
//	p -= lr * WeightDecay * p            (decoupled decay, only where decay[i])
//	m = Beta1 m + (1-Beta1) g
//	v = Beta2 v + (1-Beta2) g²
//	p -= lr * (m / (1-Beta1^t)) / (sqrt(v / (1-Beta2^t)) + Eps)
//
// Elements are independent, so any split of the buffer over ranks gives the same bits. Update
// leaves grads unchanged and returns an error, changing nothing, when the lengths of params,
// grads, decay, st.M and st.V differ.
func Update(c Config, st *State, params, grads []float32, decay []bool, clip float32) (float64, error) {
	n := len(params)
	if len(grads) != n || len(st.M) != n || len(st.V) != n || (decay != nil && len(decay) != n) {
		return 0, fmt.Errorf("optim: update: lengths differ: params %d, grads %d, m %d, v %d, decay %d",
			n, len(grads), len(st.M), len(st.V), len(decay))
	}
	lr := c.LRAt(st.Step)
	st.Step++
	t := float64(st.Step)
	bc1 := 1 - math.Pow(c.Beta1, t)
	bc2 := 1 - math.Pow(c.Beta2, t)
	shrink := 1 - lr*c.WeightDecay
	k := float64(clip)
	for i, p := range params {
		g := k * float64(grads[i])
		pp := float64(p)
		if decay != nil && decay[i] {
			pp *= shrink
		}
		m := c.Beta1*float64(st.M[i]) + (1-c.Beta1)*g
		v := c.Beta2*float64(st.V[i]) + (1-c.Beta2)*g*g
		st.M[i], st.V[i] = float32(m), float32(v)
		pp -= lr * (m / bc1) / (math.Sqrt(v/bc2) + c.Eps)
		params[i] = float32(pp)
	}
	return lr, nil
}
