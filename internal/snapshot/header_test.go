package snapshot

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// NewestHeader is the newer complete header of a rank's two slots; a slot
// made incomplete (its header zeroed, as a write begins) does not count,
// and a rank with no slot has none.
func TestNewestHeader(t *testing.T) {
	dir := t.TempDir()
	_, ok := NewestHeader(dir, 0)
	require.False(t, ok)
	for _, step := range []uint64{3, 4} {
		s, err := OpenRank(dir, 0)
		require.NoError(t, err)
		require.NoError(t, s.Write(Header{Step: step, World: 1, Length: 2}, bytes.NewReader([]byte("ab"))))
		require.NoError(t, s.Close())
	}
	step, ok := NewestHeader(dir, 0)
	require.True(t, ok)
	require.Equal(t, uint64(4), step)
	for _, p := range Paths(dir, 0) {
		if s, err := Verify(p); err == nil && s.Step == 4 {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = f.WriteAt(make([]byte, HeaderLen), 0)
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}
	}
	step, ok = NewestHeader(dir, 0)
	require.True(t, ok)
	require.Equal(t, uint64(3), step)
}
