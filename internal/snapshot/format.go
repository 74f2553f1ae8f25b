package snapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"
)

// Format constants of version 2 (docs/snapshots-format.md).
const (
	// Magic is the first 8 bytes of a complete slot.
	Magic = "GORUNSNP"
	// Version is the only format version this package reads and writes.
	Version = 2
	// HeaderSize is the size of the header region: the payload's offset.
	HeaderSize = 4096
	// HeaderLen is the number of header bytes in use at the start of the
	// region; a writer zeroes them before it rewrites a slot, and writes
	// them last.
	HeaderLen = 64
	// headerCRC is the offset of the header's own CRC; it covers [0, headerCRC).
	headerCRC = 48
)

// FlagReplicated marks a snapshot whose state is the same on every rank
// (data parallel): any rank of any world size may restore it.
const FlagReplicated uint32 = 1

// knownFlags are the flag bits version 2 defines; a header with another
// bit set is not a version-2 header.
const knownFlags = FlagReplicated

// EnvDir is the worker environment variable that names the snapshot
// directory; without it the Python package does nothing.
const EnvDir = "GORUN_SNAPSHOT_DIR"

var (
	// ErrIncomplete means the slot has no whole, valid header: never
	// written, torn, another version, or a save in progress or cut short.
	ErrIncomplete = errors.New("snapshot: slot incomplete")
	// ErrCorrupt means the header is whole but the payload's CRC-32
	// differs from it, or the file is shorter than the header says.
	ErrCorrupt = errors.New("snapshot: payload corrupt")
	// ErrNone means no slot holds a complete snapshot.
	ErrNone = errors.New("snapshot: no complete snapshot")
)

// Header is a slot's parsed, self-consistent header.
type Header struct {
	Step   uint64 // the training step the snapshot holds
	Length uint64 // payload bytes, starting at HeaderSize
	CRC    uint32 // CRC-32 (IEEE) of the payload
	Flags  uint32 // FlagReplicated or 0
	Rank   int    // the global rank that saved it
	World  int    // the world size when it was saved
}

// Replicated reports whether the header carries FlagReplicated: the state
// is the same on every rank, and any rank of any world may restore it.
func (h Header) Replicated() bool { return h.Flags&FlagReplicated != 0 }

// validate returns an error naming the field when h cannot be written as a
// version-2 header.
func (h Header) validate() error {
	switch {
	case h.World < 1 || h.World > 1<<31-1:
		return fmt.Errorf("snapshot: world size %d, want 1 to %d", h.World, 1<<31-1)
	case h.Rank < 0 || h.Rank >= h.World:
		return fmt.Errorf("snapshot: rank %d outside the world of %d", h.Rank, h.World)
	case h.Flags&^knownFlags != 0:
		return fmt.Errorf("snapshot: flags %#x: only FlagReplicated (%#x) is defined", h.Flags, FlagReplicated)
	}
	return nil
}

// ParseHeader returns the header of the slot file contents b (at least its
// first HeaderLen bytes). It returns an error wrapping ErrIncomplete, with
// the reason, when the magic, version, payload offset or the header's own
// CRC-32 is wrong, or the CRC-valid header holds an impossible rank, world
// or flag.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, fmt.Errorf("%w: %d bytes, a header has %d", ErrIncomplete, len(b), HeaderLen)
	}
	le := binary.LittleEndian
	switch {
	case !bytes.Equal(b[:8], []byte(Magic)):
		return Header{}, fmt.Errorf("%w: no magic", ErrIncomplete)
	case le.Uint32(b[8:]) != Version:
		return Header{}, fmt.Errorf("%w: version %d, want %d", ErrIncomplete, le.Uint32(b[8:]), Version)
	case le.Uint32(b[12:]) != HeaderSize:
		return Header{}, fmt.Errorf("%w: payload offset %d, want %d", ErrIncomplete, le.Uint32(b[12:]), HeaderSize)
	case crc32.ChecksumIEEE(b[:headerCRC]) != le.Uint32(b[headerCRC:]):
		return Header{}, fmt.Errorf("%w: header CRC-32 mismatch", ErrIncomplete)
	}
	h := Header{
		Step: le.Uint64(b[16:]), Length: le.Uint64(b[24:]), CRC: le.Uint32(b[32:]),
		Flags: le.Uint32(b[36:]), Rank: int(le.Uint32(b[40:])), World: int(le.Uint32(b[44:])),
	}
	if err := h.validate(); err != nil {
		return Header{}, fmt.Errorf("%w: %w", ErrIncomplete, err)
	}
	return h, nil
}

// Bytes returns the HeaderLen header bytes of h, with the header's own
// CRC-32 and the trailing zeros. Rank and World must fit in 32 bits (a
// writer checks them first; RankSlots.Write does).
func (h Header) Bytes() [HeaderLen]byte {
	var b [HeaderLen]byte
	le := binary.LittleEndian
	copy(b[:], Magic)
	le.PutUint32(b[8:], Version)
	le.PutUint32(b[12:], HeaderSize)
	le.PutUint64(b[16:], h.Step)
	le.PutUint64(b[24:], h.Length)
	le.PutUint32(b[32:], h.CRC)
	le.PutUint32(b[36:], h.Flags)
	le.PutUint32(b[40:], uint32(h.Rank))
	le.PutUint32(b[44:], uint32(h.World))
	le.PutUint32(b[headerCRC:], crc32.ChecksumIEEE(b[:headerCRC]))
	return b
}

// Paths returns the two slot files of a global rank in dir, as every
// writer names them: rank-<rank>.slot0 and rank-<rank>.slot1.
func Paths(dir string, rank int) [2]string {
	var p [2]string
	for i := range p {
		p[i] = filepath.Join(dir, fmt.Sprintf("rank-%d.slot%d", rank, i))
	}
	return p
}
