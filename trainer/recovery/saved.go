package recovery

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"unsafe"
)

// Run names the training run a saved Slice belongs to: Config is the hash
// of the train.toml fields that change the math (config.Config.Hash, 64
// hex digits) and Size the model's element count (model.Layout.Size). A
// Slice saved by another run is refused, however well formed.
type Run struct {
	Config string
	Size   int
}

// The payload of a saved Slice, the embedded trainer's own format, as a
// snapshot slot holds it (internal/snapshot; the slot's header holds the
// step and the payload's CRC-32). Little-endian:
//
//	0    8  magic "GORUNTRS"
//	8    4  version, 1
//	12   4  zero
//	16   8  Lo
//	24   8  Hi
//	32   8  the model's element count (Run.Size)
//	40  64  the config hash (Run.Config), ASCII
//	104 24  zero
//	128     Hi-Lo float32 parameters, then Hi-Lo of AdamW's m, then of v
//
// That is all a rank needs to go on after the step bit for bit: the
// parameters and both moments of its elements; the sample index and the
// learning rate follow from the step (see State).
const (
	savedMagic   = "GORUNTRS"
	savedVersion = 1
	savedHeader  = 128
	hashLen      = 64
)

var (
	// ErrBadSaved marks a payload that is not a saved Slice: another
	// format or version, cut short, or a range no Slice has.
	ErrBadSaved = errors.New("recovery: not a saved slice")
	// ErrOtherRun marks a saved Slice of another run: another config hash
	// or model size than the Run it is parsed for.
	ErrOtherRun = errors.New("recovery: a saved slice of another run")
)

// SavedLen is the length of the payload of a saved Slice of elems
// elements.
func SavedLen(elems int) int { return savedHeader + 12*elems }

// Saved is the payload of s saved for run r (SavedLen(s.Len()) bytes), to
// read once. It reads s's arrays where they are (a view of their memory on
// a little-endian machine): they must not change until it is read. It
// panics when r.Config is not 64 bytes long.
func (s Slice) Saved(r Run) io.Reader {
	if len(r.Config) != hashLen {
		panic(fmt.Sprintf("recovery: config hash of %d bytes, want %d", len(r.Config), hashLen))
	}
	h := make([]byte, savedHeader)
	copy(h, savedMagic)
	le := binary.LittleEndian
	le.PutUint32(h[8:], savedVersion)
	le.PutUint64(h[16:], uint64(s.Lo))
	le.PutUint64(h[24:], uint64(s.Hi))
	le.PutUint64(h[32:], uint64(r.Size))
	copy(h[40:], r.Config)
	return io.MultiReader(bytes.NewReader(h), bytes.NewReader(leBytes(s.Params)),
		bytes.NewReader(leBytes(s.M)), bytes.NewReader(leBytes(s.V)))
}

// ParseSaved is the Slice of step step (the slot header's) that Saved
// wrote into payload, in arrays of its own. A payload that is not one is
// an error wrapping ErrBadSaved; one of another run than r, ErrOtherRun.
// It never panics.
func ParseSaved(step uint64, payload []byte, r Run) (Slice, error) {
	if len(payload) < savedHeader || string(payload[:8]) != savedMagic {
		return Slice{}, fmt.Errorf("%w: no %q header", ErrBadSaved, savedMagic)
	}
	le := binary.LittleEndian
	if v := le.Uint32(payload[8:]); v != savedVersion {
		return Slice{}, fmt.Errorf("%w: version %d, want %d", ErrBadSaved, v, savedVersion)
	}
	lo, hi, size := le.Uint64(payload[16:]), le.Uint64(payload[24:]), le.Uint64(payload[32:])
	body := uint64(len(payload) - savedHeader)
	switch {
	case step > math.MaxInt64:
		return Slice{}, fmt.Errorf("%w: step %d", ErrBadSaved, step)
	case lo > hi || hi > math.MaxInt64/2 || hi-lo > body/12 || (hi-lo)*12 != body:
		return Slice{}, fmt.Errorf("%w: elements [%d, %d) in %d bytes of arrays", ErrBadSaved, lo, hi, body)
	case string(payload[40:40+hashLen]) != r.Config:
		return Slice{}, fmt.Errorf("%w: config hash %.12s..., this run's %.12s... (the fields of train.toml that change the math differ)",
			ErrOtherRun, payload[40:40+hashLen], r.Config)
	case size != uint64(r.Size):
		return Slice{}, fmt.Errorf("%w: a model of %d elements, this run's has %d", ErrOtherRun, size, r.Size)
	}
	s := Make(int64(step), int(lo), int(hi))
	b := payload[savedHeader:]
	for _, fs := range [][]float32{s.Params, s.M, s.V} {
		b = fromLE(fs, b)
	}
	return s, nil
}

// littleEndian reports whether the machine lays float32s out as the
// payload does.
func littleEndian() bool { return binary.NativeEndian.Uint16([]byte{1, 0}) == 1 }

// leBytes is fs as little-endian bytes: a view of its memory on a
// little-endian machine, a copy elsewhere.
func leBytes(fs []float32) []byte {
	if !littleEndian() {
		return appendFloats(nil, fs)
	}
	if len(fs) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(fs))), 4*len(fs))
}

// fromLE fills fs from the little-endian bytes at the start of b and
// returns the rest of b, which must hold 4*len(fs) bytes.
func fromLE(fs []float32, b []byte) []byte {
	if !littleEndian() {
		return readFloats(fs, b)
	}
	n := copy(leBytes(fs), b[:4*len(fs)])
	return b[n:]
}
