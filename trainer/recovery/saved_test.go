package recovery

import (
	"encoding/binary"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// savedRun is a run whose config hash is 64 hex digits.
var savedRun = Run{Config: strings.Repeat("ab12", 16), Size: 10}

// savedBytes is the payload s.Saved(r) reads.
func savedBytes(t *testing.T, s Slice, r Run) []byte {
	t.Helper()
	b, err := io.ReadAll(s.Saved(r))
	require.NoError(t, err)
	require.Len(t, b, SavedLen(s.Len()))
	return b
}

// TestSavedRoundTrip: ParseSaved gives back, bit for bit and in arrays of
// its own, the Slice Saved wrote, at the step of the slot's header,
// including an empty one and values a float parse would not keep (NaN
// payload bits, -0, infinities, subnormals).
func TestSavedRoundTrip(t *testing.T) {
	odd := Make(7, 2, 8)
	odd.Params[0] = math.Float32frombits(0x7fc01234) // a NaN with payload
	odd.Params[1] = float32(math.Copysign(0, -1))
	odd.M[2] = float32(math.Inf(-1))
	odd.V[3] = math.Float32frombits(1) // the smallest subnormal
	tests := []struct {
		name string
		s    Slice
		step uint64
	}{
		{"numbered", numbered(3, 0, 6), 3},
		{"at an offset, past the model (padding)", numbered(12, 6, 12), 12},
		{"empty", Make(5, 4, 4), 5},
		{"odd values", odd, 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := savedBytes(t, tc.s, savedRun)
			got, err := ParseSaved(tc.step, b, savedRun)
			require.NoError(t, err)
			require.Equal(t, tc.s.Lo, got.Lo)
			require.Equal(t, tc.s.Hi, got.Hi)
			require.EqualValues(t, tc.step, got.Step)
			for i, pair := range [][2][]float32{{tc.s.Params, got.Params}, {tc.s.M, got.M}, {tc.s.V, got.V}} {
				require.Len(t, pair[1], len(pair[0]), "array %d", i)
				for k := range pair[0] {
					require.Equal(t, math.Float32bits(pair[0][k]), math.Float32bits(pair[1][k]), "array %d, element %d", i, k)
				}
			}
			if len(got.Params) > 0 {
				before := math.Float32bits(got.Params[0])
				b[savedHeader] ^= 0xff
				require.Equal(t, before, math.Float32bits(got.Params[0]), "the parsed slice does not alias the payload")
			}
		})
	}
}

// TestSavedIsLittleEndian pins the layout the format documents: header
// fields at their offsets, then params, m and v as little-endian float32.
func TestSavedIsLittleEndian(t *testing.T) {
	s := numbered(3, 4, 6)
	b := savedBytes(t, s, savedRun)
	le := binary.LittleEndian
	require.Equal(t, "GORUNTRS", string(b[:8]))
	require.EqualValues(t, 1, le.Uint32(b[8:]))
	require.EqualValues(t, 4, le.Uint64(b[16:]))
	require.EqualValues(t, 6, le.Uint64(b[24:]))
	require.EqualValues(t, savedRun.Size, le.Uint64(b[32:]))
	require.Equal(t, savedRun.Config, string(b[40:104]))
	require.Equal(t, make([]byte, 24), b[104:128])
	want := append(append(append([]float32(nil), s.Params...), s.M...), s.V...)
	for i, f := range want {
		require.Equal(t, math.Float32bits(f), le.Uint32(b[128+4*i:]), "float %d", i)
	}
}

// TestParseSavedRefuses: a payload that is not a saved Slice of this run
// is an error naming why, wrapping ErrBadSaved or ErrOtherRun, and never
// a panic. (A torn or corrupt slot never gets here: the slot's CRC-32
// refuses it first; see internal/snapshot.)
func TestParseSavedRefuses(t *testing.T) {
	good := savedBytes(t, numbered(3, 0, 6), savedRun)
	edit := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	put := func(off int, v uint64) []byte {
		return edit(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[off:], v); return b })
	}
	tests := []struct {
		name    string
		payload []byte
		step    uint64
		run     Run
		want    error
		says    string
	}{
		{"empty", nil, 3, savedRun, ErrBadSaved, "no \"GORUNTRS\" header"},
		{"a header only, cut short", good[:savedHeader-1], 3, savedRun, ErrBadSaved, "header"},
		{"another magic", edit(func(b []byte) []byte { b[0] = 'X'; return b }), 3, savedRun, ErrBadSaved, "header"},
		{"another version", edit(func(b []byte) []byte { b[8] = 2; return b }), 3, savedRun, ErrBadSaved, "version 2"},
		{"arrays cut short", good[:len(good)-4], 3, savedRun, ErrBadSaved, "elements [0, 6)"},
		{"arrays too long", append(append([]byte(nil), good...), 0, 0, 0, 0), 3, savedRun, ErrBadSaved, "elements [0, 6)"},
		{"lo past hi", put(16, 7), 3, savedRun, ErrBadSaved, "elements [7, 6)"},
		{"a range that overflows", put(24, math.MaxUint64), 3, savedRun, ErrBadSaved, "elements"},
		{"a range whose size overflows to the length", put(24, 1<<62+6), 3, savedRun, ErrBadSaved, "elements"},
		{"a step past int64", good, math.MaxUint64, savedRun, ErrBadSaved, "step"},
		{"another config", good, 3, Run{Config: strings.Repeat("cd34", 16), Size: 10}, ErrOtherRun, "config hash ab12ab12ab12"},
		{"another model size", good, 3, Run{Config: savedRun.Config, Size: 11}, ErrOtherRun, "a model of 10 elements, this run's has 11"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseSaved(tc.step, tc.payload, tc.run)
			require.ErrorIs(t, err, tc.want)
			require.ErrorContains(t, err, tc.says)
		})
	}
}

// FuzzParseSaved: whatever the bytes, ParseSaved returns a valid Slice
// or an error, and never panics.
func FuzzParseSaved(f *testing.F) {
	b, _ := io.ReadAll(numbered(3, 0, 6).Saved(savedRun))
	f.Add(uint64(3), b)
	f.Add(uint64(0), []byte("GORUNTRS"))
	f.Fuzz(func(t *testing.T, step uint64, payload []byte) {
		s, err := ParseSaved(step, payload, savedRun)
		if err == nil {
			require.NoError(t, s.Validate())
		}
	})
}
