package snapshot

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// encode builds a complete slot file of h (Length and CRC taken from
// payload) and payload, as the Python package writes one.
func encode(h Header, payload []byte) []byte {
	h.Length = uint64(len(payload))
	h.CRC = crc32.ChecksumIEEE(payload)
	hb := h.Bytes()
	b := make([]byte, HeaderSize+len(payload))
	copy(b, hb[:])
	copy(b[HeaderSize:], payload)
	return b
}

// with returns a copy of b changed by f.
func with(b []byte, f func([]byte)) []byte {
	c := append([]byte(nil), b...)
	f(c)
	return c
}

// resealed returns b with the header's own CRC recomputed: a header that
// is whole but says something else.
func resealed(b []byte, f func([]byte)) []byte {
	return with(b, func(c []byte) {
		f(c)
		binary.LittleEndian.PutUint32(c[headerCRC:], crc32.ChecksumIEEE(c[:headerCRC]))
	})
}

func TestHeaderBytesAndParse(t *testing.T) {
	h := Header{Step: 42, Length: 7, CRC: 0xdeadbeef, Flags: FlagReplicated, Rank: 3, World: 4}
	raw := h.Bytes()
	got, err := ParseHeader(raw[:])
	require.NoError(t, err)
	require.Equal(t, h, got)
	require.True(t, got.Replicated())
	require.Equal(t, make([]byte, HeaderLen-headerCRC-4), raw[headerCRC+4:], "bytes 52-63 are zero")
	// Every bit of [0, 52) is checked: a flipped one is an incomplete header.
	for i := range headerCRC + 4 {
		torn := raw
		torn[i] ^= 0x10
		_, err := ParseHeader(torn[:])
		require.ErrorIs(t, err, ErrIncomplete, "byte %d flipped", i)
	}
}

func TestParseHeader(t *testing.T) {
	good := Header{Step: 9, Length: 1, Rank: 1, World: 2}.Bytes()
	le := binary.LittleEndian
	tests := []struct {
		name string
		raw  []byte
		want string // "" for success
	}{
		{"whole", good[:], ""},
		{"short", good[:HeaderLen-1], "a header has 64"},
		{"zeroed (a save in progress)", make([]byte, HeaderLen), "no magic"},
		{"version 1", resealed(good[:], func(b []byte) { le.PutUint32(b[8:], 1) }), "version 1, want 2"},
		{"another payload offset", resealed(good[:], func(b []byte) { le.PutUint32(b[12:], 8192) }), "payload offset 8192"},
		{"torn: the step written, not the CRC", with(good[:], func(b []byte) { b[16]++ }), "header CRC-32 mismatch"},
		{"rank outside the world", resealed(good[:], func(b []byte) { le.PutUint32(b[40:], 2) }), "rank 2 outside the world of 2 (and not replicated)"},
		{"world 0", resealed(good[:], func(b []byte) { le.PutUint32(b[44:], 0) }), "world size 0"},
		{"an unknown flag", resealed(good[:], func(b []byte) { le.PutUint32(b[36:], 2) }), "flags 0x2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := ParseHeader(tt.raw)
			if tt.want == "" {
				require.NoError(t, err)
				require.Equal(t, Header{Step: 9, Length: 1, CRC: 0, Rank: 1, World: 2}, h)
				return
			}
			require.ErrorIs(t, err, ErrIncomplete)
			require.ErrorContains(t, err, tt.want)
		})
	}
}

func TestVerify(t *testing.T) {
	payload := []byte("the state of rank 0 at step 42")
	good := encode(Header{Step: 42, Rank: 0, World: 1}, payload)
	tests := []struct {
		name string
		file []byte // nil: no file
		want error  // nil: the slot of step 42
	}{
		{"complete", good, nil},
		{"trailing bytes (a slot sized for a larger state)", append(append([]byte(nil), good...), 1, 2, 3), nil},
		{"no file", nil, fs.ErrNotExist},
		{"empty file", []byte{}, ErrIncomplete},
		{"zeroed header (a save in progress)", with(good, func(b []byte) { clear(b[:HeaderLen]) }), ErrIncomplete},
		{"torn header", with(good, func(b []byte) { b[20]++ }), ErrIncomplete},
		{"bad payload CRC", with(good, func(b []byte) { b[HeaderSize+3] ^= 1 }), ErrCorrupt},
		{"payload cut short", good[:len(good)-1], ErrCorrupt},
		{"header region only", good[:HeaderSize], ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rank-0.slot0")
			if tt.file != nil {
				require.NoError(t, os.WriteFile(path, tt.file, 0o600))
			}
			s, err := Verify(path)
			if tt.want != nil {
				require.ErrorIs(t, err, tt.want)
				require.ErrorContains(t, err, path)
				return
			}
			require.NoError(t, err)
			require.Equal(t, Slot{Header: Header{Step: 42, Length: uint64(len(payload)), CRC: crc32.ChecksumIEEE(payload), World: 1}, Path: path}, s)
			got, err := ReadPayload(s)
			require.NoError(t, err)
			require.Equal(t, payload, got)
		})
	}
}

func TestNewest(t *testing.T) {
	slot := func(step uint64) []byte { return encode(Header{Step: step, Rank: 1, World: 2}, []byte{byte(step)}) }
	torn := with(slot(9), func(b []byte) { b[20]++ })
	corrupt := with(slot(9), func(b []byte) { b[HeaderSize] ^= 1 })
	tests := []struct {
		name     string
		slots    [2][]byte // nil: no file
		wantStep uint64
		wantNone bool
	}{
		{"the higher step of two", [2][]byte{slot(7), slot(8)}, 8, false},
		{"the higher step in slot 0", [2][]byte{slot(8), slot(7)}, 8, false},
		{"the newer torn: the older", [2][]byte{slot(8), torn}, 8, false},
		{"the newer corrupt: the older", [2][]byte{corrupt, slot(8)}, 8, false},
		{"one file only", [2][]byte{slot(3), nil}, 3, false},
		{"none complete", [2][]byte{torn, corrupt}, 0, true},
		{"no files", [2][]byte{nil, nil}, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			paths := Paths(t.TempDir(), 1)
			for i, b := range tt.slots {
				if b != nil {
					require.NoError(t, os.WriteFile(paths[i], b, 0o600))
				}
			}
			s, err := Newest(paths[:]...)
			if tt.wantNone {
				require.ErrorIs(t, err, ErrNone)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantStep, s.Step)
		})
	}
}

// TestReadPayloadRefusesARewrittenSlot: a slot overwritten between Verify
// and ReadPayload is an error, not the new or a torn payload.
func TestReadPayloadRefusesARewrittenSlot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rank-0.slot0")
	require.NoError(t, os.WriteFile(path, encode(Header{Step: 1, World: 1}, []byte("one")), 0o600))
	s, err := Verify(path)
	require.NoError(t, err)
	tests := []struct {
		name string
		file []byte
		want error
	}{
		{"a newer step", encode(Header{Step: 2, World: 1}, []byte("two")), ErrIncomplete},
		{"a save in progress", make([]byte, HeaderSize+3), ErrIncomplete},
		{"the payload changed under the same header", with(encode(Header{Step: 1, World: 1}, []byte("one")), func(b []byte) { b[HeaderSize] = 'O' }), ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(path, tt.file, 0o600))
			_, err := ReadPayload(s)
			require.ErrorIs(t, err, tt.want)
		})
	}
}

func TestScan(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) { require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o600)) }
	write("rank-3.slot0", encode(Header{Step: 5, Rank: 3, World: 4}, []byte("a")))
	write("rank-3.slot1", encode(Header{Step: 6, Rank: 3, World: 4}, []byte("b")))
	write("rank-0.slot1", encode(Header{Step: 6, Flags: FlagReplicated, Rank: 0, World: 2}, []byte("c")))
	write("rank-0.slot0", make([]byte, HeaderSize))                                                                             // incomplete
	write("rank-1.slot0", with(encode(Header{Step: 6, Rank: 1, World: 4}, []byte("d")), func(b []byte) { b[HeaderSize] ^= 1 })) // corrupt
	write("rank-2.slot0", encode(Header{Step: 6, Rank: 1, World: 4}, []byte("e")))                                              // another rank's header
	write("rank-07.slot0", encode(Header{Step: 6, Rank: 7, World: 8}, []byte("f")))                                             // not a slot name
	write("rank-5.slot2", encode(Header{Step: 6, Rank: 5, World: 8}, []byte("g")))                                              // not a slot name
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "python", "gorun"), 0o700))

	got, err := Scan(dir)
	require.NoError(t, err)
	require.Equal(t, []Holding{
		{Rank: 0, World: 2, Step: 6, Replicated: true, Path: filepath.Join(dir, "rank-0.slot1")},
		{Rank: 3, World: 4, Step: 5, Path: filepath.Join(dir, "rank-3.slot0")},
		{Rank: 3, World: 4, Step: 6, Path: filepath.Join(dir, "rank-3.slot1")},
	}, got)

	_, err = Scan(filepath.Join(dir, "missing"))
	require.ErrorIs(t, err, fs.ErrNotExist)
}

// TestRankSlotsWrite: writes alternate between the slots; a write that
// fails (short payload, wrong CRC) leaves the other slot's snapshot the
// newest complete one; a reopened RankSlots overwrites the older slot.
func TestRankSlotsWrite(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenRank(dir, 5)
	require.NoError(t, err)
	defer s.Close()
	w := func(step uint64, payload string) error {
		return s.Write(Header{Step: step, Length: uint64(len(payload)), World: 8, Rank: 0}, bytes.NewReader([]byte(payload)))
	}
	newest := func() (uint64, string) {
		p := Paths(dir, 5)
		sl, err := Newest(p[:]...)
		require.NoError(t, err)
		b, err := ReadPayload(sl)
		require.NoError(t, err)
		require.Equal(t, 5, sl.Rank, "Write sets the rank")
		return sl.Step, string(b)
	}
	require.NoError(t, w(1, "one"))
	require.NoError(t, w(2, "two, longer"))
	require.Equal(t, []uint64{1, 2}, s.Steps())
	step, b := newest()
	require.Equal(t, uint64(2), step)
	require.Equal(t, "two, longer", b)

	// A payload shorter than its header says: step 1's slot is now
	// incomplete, step 2 stays the newest.
	err = s.Write(Header{Step: 3, Length: 10, World: 8}, bytes.NewReader([]byte("short")))
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.Equal(t, []uint64{2}, s.Steps())
	step, _ = newest()
	require.Equal(t, uint64(2), step)

	// A copy whose bytes do not match the sender's CRC.
	err = s.Write(Header{Step: 3, Length: 5, World: 8, CRC: crc32.ChecksumIEEE([]byte("three"))}, bytes.NewReader([]byte("thre3")))
	require.ErrorIs(t, err, ErrCorrupt)
	step, _ = newest()
	require.Equal(t, uint64(2), step)
	// The same with the right bytes.
	require.NoError(t, s.Write(Header{Step: 3, Length: 5, World: 8, CRC: crc32.ChecksumIEEE([]byte("three"))}, bytes.NewReader([]byte("three"))))
	require.NoError(t, s.Close())
	require.ErrorContains(t, w(9, "x"), "after Close")

	// Reopened: it finds 2 and 3 and overwrites 2.
	s, err = OpenRank(dir, 5)
	require.NoError(t, err)
	require.ElementsMatch(t, []uint64{2, 3}, s.Steps())
	require.NoError(t, w(4, "four"))
	require.ElementsMatch(t, []uint64{3, 4}, s.Steps())
	step, b = newest()
	require.Equal(t, uint64(4), step)
	require.Equal(t, "four", b)

	// A replicated snapshot of a world of 2 copied under rank 5's name.
	require.NoError(t, s.Write(Header{Step: 5, Length: 4, World: 2, Flags: FlagReplicated}, bytes.NewReader([]byte("five"))))
	step, _ = newest()
	require.Equal(t, uint64(5), step)
	for _, bad := range []Header{{Step: 1, World: 0}, {Step: 1, World: 5}, {Step: 1, World: 8, Flags: 4}} {
		require.Error(t, s.Write(bad, bytes.NewReader(nil)), "%+v", bad)
	}
	require.ElementsMatch(t, []uint64{4, 5}, s.Steps(), "a refused header touches nothing")
}

// BenchmarkVerify verifies a 64 MiB slot: the rate at which the agent can
// check a snapshot (hash/crc32's IEEE table is PCLMUL-accelerated).
func BenchmarkVerify(b *testing.B) {
	path := filepath.Join(b.TempDir(), "rank-0.slot0")
	require.NoError(b, os.WriteFile(path, encode(Header{Step: 1, World: 1}, make([]byte, 64<<20)), 0o600))
	b.SetBytes(64 << 20)
	for b.Loop() {
		if _, err := Verify(path); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScan verifies a directory of 4 ranks' 2 slots of 16 MiB each,
// as an agent does before a round: the slots side by side.
func BenchmarkScan(b *testing.B) {
	dir := b.TempDir()
	for rank := range 4 {
		for slot, path := range Paths(dir, rank) {
			require.NoError(b, os.WriteFile(path, encode(Header{Step: uint64(slot + 1), Rank: rank, World: 4}, make([]byte, 16<<20)), 0o600))
		}
	}
	b.SetBytes(8 * 16 << 20)
	for b.Loop() {
		held, err := Scan(dir)
		if err != nil || len(held) != 8 {
			b.Fatalf("scan: %d holdings, %v", len(held), err)
		}
	}
}
