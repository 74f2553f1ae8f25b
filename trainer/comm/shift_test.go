package comm

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/testutil"
)

// shiftPayload is member r's data: n bytes that name r.
func shiftPayload(r, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r*31 + i*7)
	}
	return b
}

// TestShift: every member receives its ring predecessor's data, over
// Unix sockets with shared memory and over TCP, for lengths below and
// above the shared-memory threshold and the chunk size, in a sub-group
// whose ring order is not rank order, members sending different lengths.
func TestShift(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tcpOnly bool
		order   []int  // ring order of the group, over a world of 4
		lengths [4]int // bytes each rank sends
	}{
		{"unix small", false, []int{0, 1, 2, 3}, [4]int{10, 10, 10, 10}},
		{"unix chunks", false, []int{0, 2, 1, 3}, [4]int{3*chunkBytes + 5, 3*chunkBytes + 5, 3*chunkBytes + 5, 3*chunkBytes + 5}},
		{"tcp uneven", true, []int{3, 1, 0, 2}, [4]int{0, 40 << 10, 2*chunkBytes + 1, 1}},
		{"unix uneven", false, []int{1, 3}, [4]int{0, shmMin, 0, chunkBytes + 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			worlds := startWorld(t, 4, func(c *Config) { c.TCPOnly = tc.tcpOnly })
			pos := map[int]int{}
			for i, r := range tc.order {
				pos[r] = i
			}
			got := make([][]byte, 4)
			testutil.RequireRanks(t, testutil.OnRanks(4, func(r int) error {
				i, member := pos[r]
				if !member {
					return nil
				}
				g, err := worlds[r].Group(tc.order)
				if err != nil {
					return err
				}
				prev := tc.order[(i+len(tc.order)-1)%len(tc.order)]
				got[r] = make([]byte, tc.lengths[prev])
				return g.Shift(shiftPayload(r, tc.lengths[r]), got[r])
			}))
			for i, r := range tc.order {
				prev := tc.order[(i+len(tc.order)-1)%len(tc.order)]
				require.True(t, bytes.Equal(shiftPayload(prev, tc.lengths[prev]), got[r]), "rank %d got rank %d's data", r, prev)
			}
		})
	}
}

// Members that expect another length than their predecessors send fail
// the shift, naming the peer; a group of one copies.
func TestShiftBadInput(t *testing.T) {
	worlds := startWorld(t, 2, nil)
	errs := testutil.OnRanks(2, func(r int) error {
		return worlds[r].All().Shift(make([]byte, 8+r), make([]byte, 8+r)) // each expects its own length
	})
	for r, err := range errs {
		var pe *PeerError
		require.ErrorAs(t, err, &pe, "rank %d", r)
		require.Equal(t, 1-r, pe.Rank, "rank %d", r)
	}

	one := startWorld(t, 1, nil)[0]
	out := make([]byte, 3)
	require.NoError(t, one.All().Shift([]byte("abc"), out))
	require.Equal(t, "abc", string(out))
	require.ErrorContains(t, one.All().Shift([]byte("abc"), out[:2]), "len(recv) = 2")
}
