package snapshot

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// RankSlots writes one rank's two slot files with the crash-safe protocol
// of docs/snapshots-format.md: the slot that is not complete, else the one
// with the lower step, is made incomplete (its header zeroed), its payload
// written, and its header written last, so a process killed at any point
// leaves the other slot whole. One RankSlots per rank and directory at a
// time: it does not lock against another writer (a worker's Python package
// included). It is not safe for concurrent use.
type RankSlots struct {
	dir      string
	rank     int
	files    [2]*os.File
	complete [2]bool
	steps    [2]uint64 // the step of each complete slot
	buf      []byte
}

// copyChunk is the size of the reads and writes of a payload.
const copyChunk = 1 << 20

// OpenRank opens (creating them, mode 0600) the slot files of global rank
// rank in dir, which must exist, and verifies them whole to learn which
// holds a complete snapshot. It returns an error naming the file when one
// cannot be created or read.
func OpenRank(dir string, rank int) (*RankSlots, error) {
	if rank < 0 || rank > 1<<31-1 {
		return nil, fmt.Errorf("snapshot: rank %d, want 0 to %d", rank, 1<<31-1)
	}
	s := &RankSlots{dir: dir, rank: rank}
	for i, p := range Paths(dir, rank) {
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("snapshot: %w", err), s.Close())
		}
		s.files[i] = f
		h, err := verify(f)
		switch {
		case err == nil:
			s.complete[i], s.steps[i] = true, h.Step
		case !errors.Is(err, ErrIncomplete) && !errors.Is(err, ErrCorrupt):
			return nil, errors.Join(fmt.Errorf("snapshot: %s: %w", p, err), s.Close())
		}
	}
	return s, nil
}

// Steps returns the step of each complete slot, lower slot first (none,
// one or two), as this RankSlots last wrote or found them.
func (s *RankSlots) Steps() []uint64 {
	var out []uint64
	for i := range s.files {
		if s.complete[i] {
			out = append(out, s.steps[i])
		}
	}
	return out
}

// target is the slot a write overwrites: one not complete, else the lower
// step (slot 0 on a tie).
func (s *RankSlots) target() int {
	switch {
	case !s.complete[0]:
		return 0
	case !s.complete[1]:
		return 1
	case s.steps[1] < s.steps[0]:
		return 1
	}
	return 0
}

// Write stores a snapshot of this rank: h.Length payload bytes read from
// payload, with h's Step, Flags and World. Write sets h.Rank to this
// rank and computes the payload's CRC-32. A non-zero h.CRC is the CRC the
// payload must have (a copy received from another node): when the bytes
// read differ, Write returns an error wrapping ErrCorrupt and writes no
// header. Once the header is written it announces the slot (Announce).
// It returns an error, leaving the slot incomplete and the other
// slot untouched, when h is invalid (world < 1, unknown flags), the reader
// ends before h.Length bytes (io.ErrUnexpectedEOF), or the space for the
// slot cannot be reserved (the message names the size).
func (s *RankSlots) Write(h Header, payload io.Reader) error {
	if s.files[0] == nil {
		return fmt.Errorf("snapshot: write of rank %d after Close", s.rank)
	}
	h.Rank = s.rank
	if err := h.validate(); err != nil {
		return err
	}
	i := s.target()
	f := s.files[i]
	s.complete[i] = false
	var zero [HeaderLen]byte
	if _, err := f.WriteAt(zero[:], 0); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	size := int64(HeaderSize + h.Length)
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		return fmt.Errorf("snapshot: cannot reserve %d bytes for a slot of rank %d in %s (give the tmpfs more room): %w",
			size, s.rank, s.dir, err)
	}
	if s.buf == nil {
		s.buf = make([]byte, copyChunk)
	}
	crc := crc32.NewIEEE()
	for off := uint64(0); off < h.Length; {
		b := s.buf[:min(uint64(len(s.buf)), h.Length-off)]
		if _, err := io.ReadFull(payload, b); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("snapshot: rank %d step %d: payload ends before its %d bytes: %w", s.rank, h.Step, h.Length, err)
		}
		crc.Write(b)
		if _, err := f.WriteAt(b, int64(HeaderSize+off)); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		off += uint64(len(b))
	}
	got := crc.Sum32()
	if h.CRC != 0 && got != h.CRC {
		return fmt.Errorf("%w: rank %d step %d: CRC-32 %#08x, expected %#08x", ErrCorrupt, s.rank, h.Step, got, h.CRC)
	}
	h.CRC = got
	hb := h.Bytes()
	if _, err := f.WriteAt(hb[:], 0); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	s.complete[i], s.steps[i] = true, h.Step
	return Announce(f.Name())
}

// Close closes the slot files (they stay: the directory's owner removes
// them). A second Close does nothing.
func (s *RankSlots) Close() error {
	var errs []error
	for i, f := range s.files {
		if f != nil {
			errs = append(errs, f.Close())
			s.files[i] = nil
		}
	}
	return errors.Join(errs...)
}
