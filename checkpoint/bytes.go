package checkpoint

import (
	"encoding/binary"
	"unsafe"
)

// elemBytes is the size of one float32 element on disk.
const elemBytes = 4

// littleEndian reports whether the host's float32 memory layout is the file layout.
func littleEndian() bool { return binary.NativeEndian.Uint16([]byte{1, 0}) == 1 }

// asBytes views s as its bytes without copying.
func asBytes(s []float32) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*elemBytes)
}

// toFile returns s as little-endian bytes: a view of s on little-endian hosts, a copy elsewhere.
func toFile(s []float32) []byte {
	b := asBytes(s)
	if littleEndian() {
		return b
	}
	out := make([]byte, len(b))
	copy(out, b)
	swap4(out)
	return out
}

// fromFile turns little-endian bytes read into a view of a []float32 into native order in place.
func fromFile(b []byte) {
	if !littleEndian() {
		swap4(b)
	}
}

func swap4(b []byte) {
	for i := 0; i+3 < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
}
