package recovery

import "fmt"

// Slice is the state of elements [Lo, Hi) of the padded flat buffer (laid
// out by the model's Layout) after Step optimizer steps: the parameters
// and AdamW's two moments, Hi-Lo of each. Elements past the model's size
// are padding, always zero. A Slice's arrays may alias someone's buffers:
// whoever hands one over says for how long they stay valid.
type Slice struct {
	Step         int64
	Lo, Hi       int
	Params, M, V []float32
}

// State is what a checkpoint of one rank holds: its Slice and where the
// data stream is.
type State struct {
	Slice
	// Sample is the global index of the next sample to train on: the
	// first after Step optimizer steps (Step times the global batch).
	Sample int64
}

// Make returns a Slice of step for elements [lo, hi) with three new zero
// arrays. It panics, as make does, when hi < lo.
func Make(step int64, lo, hi int) Slice {
	n := hi - lo
	return Slice{Step: step, Lo: lo, Hi: hi, Params: make([]float32, n), M: make([]float32, n), V: make([]float32, n)}
}

// Len is the number of elements s covers, Hi - Lo.
func (s Slice) Len() int { return s.Hi - s.Lo }

// Validate returns nil when s is well formed: Step >= 0, 0 <= Lo <= Hi, and
// Params, M and V each Hi-Lo long. Otherwise its error names the step, the
// range or the three lengths.
func (s Slice) Validate() error {
	n := s.Hi - s.Lo
	switch {
	case s.Step < 0:
		return fmt.Errorf("step %d: want 0 or more", s.Step)
	case s.Lo < 0 || n < 0:
		return fmt.Errorf("elements [%d, %d): want 0 <= lo <= hi", s.Lo, s.Hi)
	case len(s.Params) != n || len(s.M) != n || len(s.V) != n:
		return fmt.Errorf("elements [%d, %d) but %d params, %d m, %d v", s.Lo, s.Hi, len(s.Params), len(s.M), len(s.V))
	}
	return nil
}

// Sub is the part of s that covers elements [lo, hi) (indices into the
// flat buffer, not into s), of the same step; its arrays alias s's. It
// panics, as slicing does, when [lo, hi) is not inside [s.Lo, s.Hi) or s's
// arrays are short.
func (s Slice) Sub(lo, hi int) Slice {
	a, b := lo-s.Lo, hi-s.Lo
	if a < 0 || b < a || hi > s.Hi {
		panic(fmt.Sprintf("recovery: elements [%d, %d) outside [%d, %d)", lo, hi, s.Lo, s.Hi))
	}
	return Slice{Step: s.Step, Lo: lo, Hi: hi, Params: s.Params[a:b:b], M: s.M[a:b:b], V: s.V[a:b:b]}
}

// CopyFrom copies src's parameters and moments into s's arrays, as the
// builtin copy does each (up to the shorter), whatever their ranges and
// steps; it changes none of s's fields.
func (s Slice) CopyFrom(src Slice) {
	copy(s.Params, src.Params)
	copy(s.M, src.M)
	copy(s.V, src.V)
}
