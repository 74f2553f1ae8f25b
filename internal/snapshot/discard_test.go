package snapshot

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDiscard: the slots keep rejects lose their header (Scan no longer
// sees them, and a writer reuses them first); the others, files that are
// not slots and slots without a whole header are left as they were.
func TestDiscard(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) { require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o600)) }
	write("rank-0.slot0", encode(Header{Step: 5, Rank: 0, World: 2}, []byte("a")))
	write("rank-0.slot1", encode(Header{Step: 6, Rank: 0, World: 2}, []byte("b")))
	write("rank-1.slot0", encode(Header{Step: 4, Rank: 1, World: 2}, []byte("c")))
	write("rank-1.slot1", make([]byte, HeaderSize)) // incomplete
	notSlot := encode(Header{Step: 9, Rank: 0, World: 2}, []byte("d"))
	write("rank-0.slot2", notSlot)

	n, err := Discard(dir, func(step uint64) bool { return step <= 5 })
	require.NoError(t, err)
	require.Equal(t, 1, n)
	got, err := Scan(dir)
	require.NoError(t, err)
	require.Equal(t, []Holding{
		{Rank: 0, World: 2, Step: 5, Path: filepath.Join(dir, "rank-0.slot0")},
		{Rank: 1, World: 2, Step: 4, Path: filepath.Join(dir, "rank-1.slot0")},
	}, got)
	b, err := os.ReadFile(filepath.Join(dir, "rank-0.slot2"))
	require.NoError(t, err)
	require.Equal(t, notSlot, b)

	s, err := OpenRank(dir, 0)
	require.NoError(t, err)
	defer s.Close()
	require.Equal(t, 1, s.target(), "the discarded slot is written next")

	_, err = Discard(filepath.Join(dir, "missing"), func(uint64) bool { return false })
	require.Error(t, err)
}
