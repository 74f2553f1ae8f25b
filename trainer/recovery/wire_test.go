package recovery

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMessages: pieces go out in order, in messages of at most the
// bound, a piece cut where a message ends.
func TestMessages(t *testing.T) {
	p := func(lo, hi int) Piece { return Piece{Src: 1, Dst: 2, Lo: lo, Hi: hi, Offer: lo / 100} }
	tests := []struct {
		name   string
		pieces []Piece
		limit  int
		want   [][]Piece
	}{
		{"none", nil, 4, nil},
		{"one that fits", []Piece{p(0, 3)}, 4, [][]Piece{{p(0, 3)}}},
		{"exactly full", []Piece{p(0, 2), p(5, 7)}, 4, [][]Piece{{p(0, 2), p(5, 7)}}},
		{"one cut in three", []Piece{p(0, 10)}, 4, [][]Piece{{p(0, 4)}, {p(4, 8)}, {p(8, 10)}}},
		{"a cut across pieces", []Piece{p(0, 3), p(10, 13), p(200, 201)}, 4,
			[][]Piece{{p(0, 3), p(10, 11)}, {p(11, 13), p(200, 201)}}},
		{"empty pieces vanish", []Piece{p(0, 0), p(3, 5)}, 4, [][]Piece{{p(3, 5)}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Messages(tc.pieces, tc.limit)
			require.Equal(t, tc.want, got)
		})
	}
}

// TestPackUnpack: what Pack sends from the sender's offers Unpack puts at
// the same elements of the receiver's slice, bit for bit; a message of
// the wrong length or with a flipped bit is refused and copies nothing.
func TestPackUnpack(t *testing.T) {
	held := []Slice{numbered(3, 0, 6), numbered(3, 6, 12)}
	pieces := []Piece{{Src: 0, Dst: 1, Lo: 4, Hi: 6, Offer: 0}, {Src: 0, Dst: 1, Lo: 6, Hi: 9, Offer: 1}}
	msg := Pack(pieces, held)
	dst := Make(3, 3, 10)
	n, ok := Unpack(pieces, msg, dst)
	require.True(t, ok)
	require.Equal(t, 12*5, n)
	want := Make(3, 3, 10)
	want.Sub(4, 6).CopyFrom(held[0].Sub(4, 6))
	want.Sub(6, 9).CopyFrom(held[1].Sub(6, 9))
	require.Equal(t, want, dst)

	for name, bad := range map[string][]byte{
		"short":       msg[:len(msg)-1],
		"flipped bit": func() []byte { b := append([]byte(nil), msg...); b[5] ^= 1; return b }(),
	} {
		t.Run(name, func(t *testing.T) {
			dst := Make(3, 3, 10)
			_, ok := Unpack(pieces, bad, dst)
			require.False(t, ok)
			require.Equal(t, Make(3, 3, 10), dst, "nothing copied")
		})
	}
}
