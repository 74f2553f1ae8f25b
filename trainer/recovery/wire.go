package recovery

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
)

// Encode is a's wire form: little-endian int64 Done, Round, Lo, Hi and
// the number of offers, then Step, Lo, Hi and Extra (0 or 1) of each.
func (a Announcement) Encode() []byte {
	b := make([]byte, 0, 40+25*len(a.Offers))
	for _, x := range []int64{a.Done, a.Round, int64(a.Lo), int64(a.Hi), int64(len(a.Offers))} {
		b = binary.LittleEndian.AppendUint64(b, uint64(x))
	}
	for _, o := range a.Offers {
		for _, x := range []int64{o.Step, int64(o.Lo), int64(o.Hi)} {
			b = binary.LittleEndian.AppendUint64(b, uint64(x))
		}
		b = append(b, byte(b2i(o.Extra)))
	}
	return b
}

// ErrMalformed marks bytes that are not an Announcement's wire form.
var ErrMalformed = errors.New("malformed announcement")

// DecodeAnnouncement reads what Encode wrote. Bytes of any other length,
// or with a range or step no Announcement has (Done < -1, a negative
// Round, Lo or Step, Hi < Lo), are an error wrapping ErrMalformed; it
// never panics.
func DecodeAnnouncement(b []byte) (Announcement, error) {
	next := func() int64 {
		if len(b) < 8 {
			b = nil
			return -2
		}
		x := int64(binary.LittleEndian.Uint64(b))
		b = b[8:]
		return x
	}
	var a Announcement
	a.Done, a.Round, a.Lo, a.Hi = next(), next(), int(next()), int(next())
	n := next()
	if a.Done < -1 || a.Round < 0 || a.Lo < 0 || a.Hi < a.Lo || n < 0 || n > int64(len(b))/25 || int64(len(b)) != 25*n {
		return Announcement{}, ErrMalformed
	}
	for range n {
		o := Offer{Step: next(), Lo: int(next()), Hi: int(next()), Extra: b[0] == 1}
		if o.Step < 0 || o.Lo < 0 || o.Hi < o.Lo || b[0] > 1 {
			return Announcement{}, fmt.Errorf("%w: offer of step %d, [%d, %d)", ErrMalformed, o.Step, o.Lo, o.Hi)
		}
		b = b[1:]
		a.Offers = append(a.Offers, o)
	}
	return a, nil
}

// MaxMessageElems bounds the elements one transfer message carries (12
// bytes each: 96 MiB), well under comm's bound on a byte message, so that
// a slice of any size moves, and a message never needs more memory than
// that on either side.
const MaxMessageElems = 8 << 20

// Messages splits pieces, in order, into the messages that carry them,
// each of at most limit (> 0) elements; a piece that does not fit is cut
// where a message ends, and empty pieces vanish. Sender and receiver split
// alike.
func Messages(pieces []Piece, limit int) [][]Piece {
	var out [][]Piece
	var cur []Piece
	room := limit
	for _, p := range pieces {
		for p.Lo < p.Hi {
			take := p
			take.Hi = min(p.Hi, p.Lo+room)
			cur = append(cur, take)
			room -= take.Hi - take.Lo
			p.Lo = take.Hi
			if room == 0 {
				out, cur, room = append(out, cur), nil, limit
			}
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crcLen is the length of the checksum that ends every message.
const crcLen = 4

// messageLen is the length of the message that carries pieces.
func messageLen(pieces []Piece) int {
	size := crcLen
	for _, p := range pieces {
		size += 12 * (p.Hi - p.Lo)
	}
	return size
}

// Pack is the message that sends pieces from held, the sender's offers by
// index (each piece inside its offer; it panics otherwise): each piece's
// parameters, m and v as little-endian float32, then the CRC-32C of all
// of it.
func Pack(pieces []Piece, held []Slice) []byte {
	b := make([]byte, 0, messageLen(pieces))
	for _, p := range pieces {
		s := held[p.Offer].Sub(p.Lo, p.Hi)
		b = appendFloats(b, s.Params)
		b = appendFloats(b, s.M)
		b = appendFloats(b, s.V)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// Unpack checks msg, which Pack made of pieces, and copies its pieces
// into dst (each inside dst's range; it panics otherwise). It returns the
// number of bytes of state it copied, or false, copying nothing, when
// msg's length or checksum is wrong.
func Unpack(pieces []Piece, msg []byte, dst Slice) (int, bool) {
	size := messageLen(pieces)
	if len(msg) != size {
		return 0, false
	}
	body := msg[:size-crcLen]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(msg[size-crcLen:]) {
		return 0, false
	}
	for _, p := range pieces {
		s := dst.Sub(p.Lo, p.Hi)
		body = readFloats(s.Params, body)
		body = readFloats(s.M, body)
		body = readFloats(s.V, body)
	}
	return size - crcLen, true
}

// appendFloats appends the little-endian bytes of fs to b.
func appendFloats(b []byte, fs []float32) []byte {
	for _, f := range fs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return b
}

// readFloats fills fs from the little-endian bytes at the start of b and
// returns the rest of b, which must hold 4*len(fs) bytes.
func readFloats(fs []float32, b []byte) []byte {
	for i := range fs {
		fs[i] = math.Float32frombits(binary.LittleEndian.Uint32(b))
		b = b[4:]
	}
	return b
}
