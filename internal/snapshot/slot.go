package snapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
)

// Format constants of version 1 (docs/snapshots-format.md).
const (
	Magic      = "GORUNSNP" // the first 8 bytes of a complete slot
	Version    = 1          // the only version this package reads
	HeaderSize = 4096       // the payload's offset in the file
	headerLen  = 64         // the header's bytes within HeaderSize
	headerCRC  = 40         // the header CRC covers [0, headerCRC)
)

// EnvDir is the worker environment variable that names the snapshot
// directory; without it the Python package does nothing.
const EnvDir = "GORUN_SNAPSHOT_DIR"

var (
	// ErrIncomplete: the slot has no whole header (never written, torn, or
	// a save in progress or cut short).
	ErrIncomplete = errors.New("snapshot: slot incomplete")
	// ErrCorrupt: the header is whole but the payload's CRC-32C differs, or
	// the file is shorter than the header says.
	ErrCorrupt = errors.New("snapshot: payload corrupt")
	// ErrNone: no slot of the rank holds a complete snapshot.
	ErrNone = errors.New("snapshot: no complete snapshot")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Slot is a complete, verified snapshot: its step and its payload (opaque
// to Go: the Python package's serialization of the rank's state).
type Slot struct {
	Step    uint64
	Payload []byte
}

// Header is a slot's parsed, self-consistent header.
type Header struct {
	Step   uint64 // the training step the snapshot holds
	Length uint64 // payload bytes, starting at HeaderSize
	CRC    uint32 // CRC-32C (Castagnoli) of the payload
}

// ParseHeader returns the header of the slot file contents b (at least its
// first 64 bytes), or ErrIncomplete when the magic, version, payload
// offset or the header's own CRC-32C is wrong.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < headerLen {
		return Header{}, fmt.Errorf("%w: %d bytes, a header has %d", ErrIncomplete, len(b), headerLen)
	}
	le := binary.LittleEndian
	switch {
	case !bytes.Equal(b[:8], []byte(Magic)):
		return Header{}, fmt.Errorf("%w: no magic", ErrIncomplete)
	case le.Uint32(b[8:]) != Version:
		return Header{}, fmt.Errorf("%w: version %d, want %d", ErrIncomplete, le.Uint32(b[8:]), Version)
	case le.Uint32(b[12:]) != HeaderSize:
		return Header{}, fmt.Errorf("%w: payload offset %d, want %d", ErrIncomplete, le.Uint32(b[12:]), HeaderSize)
	case crc32.Checksum(b[:headerCRC], castagnoli) != le.Uint32(b[headerCRC:]):
		return Header{}, fmt.Errorf("%w: header CRC-32C mismatch", ErrIncomplete)
	}
	return Header{Step: le.Uint64(b[16:]), Length: le.Uint64(b[24:]), CRC: le.Uint32(b[32:])}, nil
}

// Parse verifies the slot file contents b and returns its snapshot; the
// payload aliases b. It returns ErrIncomplete or ErrCorrupt (wrapped, with
// the reason) when b holds no complete snapshot.
func Parse(b []byte) (Slot, error) {
	h, err := ParseHeader(b)
	if err != nil {
		return Slot{}, err
	}
	if len(b) < HeaderSize || uint64(len(b)-HeaderSize) < h.Length {
		return Slot{}, fmt.Errorf("%w: %d bytes, the header says %d", ErrCorrupt, len(b), HeaderSize+h.Length)
	}
	payload := b[HeaderSize : HeaderSize+h.Length]
	if got := crc32.Checksum(payload, castagnoli); got != h.CRC {
		return Slot{}, fmt.Errorf("%w: CRC-32C %#08x, the header says %#08x", ErrCorrupt, got, h.CRC)
	}
	return Slot{Step: h.Step, Payload: payload}, nil
}

// ReadSlot reads and verifies one slot file. Errors name the path and wrap
// ErrIncomplete, ErrCorrupt or the read error.
func ReadSlot(path string) (Slot, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Slot{}, fmt.Errorf("snapshot: %w", err)
	}
	s, err := Parse(b)
	if err != nil {
		return Slot{}, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Paths returns the two slot files of a local rank in dir, as the Python
// package names them: rank-<localRank>.slot0 and .slot1.
func Paths(dir string, localRank int) [2]string {
	var p [2]string
	for i := range p {
		p[i] = filepath.Join(dir, fmt.Sprintf("rank-%d.slot%d", localRank, i))
	}
	return p
}

// Newest returns the complete snapshot with the highest step among the slot
// files paths (a missing file counts as empty). When none is complete it
// returns an error wrapping ErrNone, joined with each slot's reason.
func Newest(paths ...string) (Slot, error) {
	var best Slot
	found := false
	var errs []error
	for _, p := range paths {
		s, err := ReadSlot(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !found || s.Step > best.Step {
			best, found = s, true
		}
	}
	if !found {
		return Slot{}, errors.Join(append([]error{ErrNone}, errs...)...)
	}
	return best, nil
}
