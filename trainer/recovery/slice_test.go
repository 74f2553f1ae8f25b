package recovery

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// numbered is a Slice of step for [lo, hi) whose values name array and
// element.
func numbered(step int64, lo, hi int) Slice {
	s := Make(step, lo, hi)
	for i := range s.Len() {
		x := float32(lo + i)
		s.Params[i], s.M[i], s.V[i] = x, x+0.25, x+0.5
	}
	return s
}

// TestValidate: a well formed Slice passes, including an empty one; a
// negative step, a range backwards or below 0, and arrays of the wrong
// length are refused, naming what is wrong.
func TestValidate(t *testing.T) {
	short := Make(2, 0, 10)
	short.V = short.V[:9]
	tests := []struct {
		name string
		s    Slice
		want string // "": valid
	}{
		{"made", Make(2, 4, 8), ""},
		{"empty", Slice{Step: 0, Lo: 3, Hi: 3}, ""},
		{"step 0 at 0", Make(0, 0, 1), ""},
		{"negative step", Slice{Step: -1}, "step -1: want 0 or more"},
		{"hi below lo", Slice{Step: 2, Lo: 5, Hi: 4}, "elements [5, 4): want 0 <= lo <= hi"},
		{"negative lo", Slice{Step: 2, Lo: -1, Hi: 0}, "elements [-1, 0): want 0 <= lo <= hi"},
		{"short v", short, "elements [0, 10) but 10 params, 10 m, 9 v"},
		{"no arrays", Slice{Step: 1, Lo: 0, Hi: 2}, "elements [0, 2) but 0 params, 0 m, 0 v"},
		{"long params", Slice{Step: 1, Lo: 0, Hi: 1, Params: make([]float32, 2), M: make([]float32, 1), V: make([]float32, 1)},
			"elements [0, 1) but 2 params, 1 m, 1 v"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.s.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tc.want)
		})
	}
}

// TestSub: Sub takes flat-buffer indices and aliases the arrays; a range
// outside the Slice panics.
func TestSub(t *testing.T) {
	s := numbered(5, 10, 20)
	sub := s.Sub(12, 15)
	require.Equal(t, Slice{Step: 5, Lo: 12, Hi: 15, Params: s.Params[2:5], M: s.M[2:5], V: s.V[2:5]}, sub)
	require.NoError(t, sub.Validate())
	sub.Params[0] = -1
	require.Equal(t, float32(-1), s.Params[2], "aliases")
	require.Equal(t, 0, s.Sub(20, 20).Len())
	require.Panics(t, func() { s.Sub(9, 12) })
	require.Panics(t, func() { s.Sub(15, 21) })
	require.Panics(t, func() { s.Sub(15, 14) })
}
