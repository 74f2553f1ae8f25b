package comm

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/testutil"
)

func TestGroupUseBytes(t *testing.T) {
	const chunk, slots, span = 512 << 10, 2 * 512 << 10, 1 << 20
	tests := []struct {
		name string
		use  GroupUse
		want int64
	}{
		{"alone", GroupUse{Members: 1, SharedMemory: true, ScatterOut: 1 << 20, ScatterElem: 8, Widen: true}, 0},
		{"two over TCP: no scratch", GroupUse{Members: 2, ScatterOut: 1 << 20, ScatterElem: 8}, chunk},
		{"two on a node", GroupUse{Members: 2, SharedMemory: true}, chunk + 2*slots},
		{"four, small slices", GroupUse{Members: 4, ScatterOut: 1000, ScatterElem: 8}, chunk + 2*8000},
		{"four, large slices: one span", GroupUse{Members: 4, ScatterOut: 1 << 30, ScatterElem: 8}, chunk + 2*span},
		{"four, float32", GroupUse{Members: 4, ScatterOut: 1 << 30, ScatterElem: 4}, chunk + 2*span},
		{"eight on a node, widened", GroupUse{Members: 8, SharedMemory: true, ScatterOut: 6_000_000, ScatterElem: 8, Widen: true},
			chunk + 2*slots + 2*span + chunk},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.use.Bytes())
		})
	}
}

// TestGroupUseIsWhatAGroupHolds: after a widened reduce-scatter of 8 MB
// slices and an all-reduce, a member holds what Bytes counts, but for the
// received chunk, which a member whose chunks all come through shared
// memory never allocates.
func TestGroupUseIsWhatAGroupHolds(t *testing.T) {
	for _, tcpOnly := range []bool{false, true} {
		const size, out = 3, 1 << 20
		worlds := startWorld(t, size, func(c *Config) { c.TCPOnly = tcpOnly })
		testutil.RequireRanks(t, testutil.OnRanks(size, func(r int) error {
			g := worlds[r].All()
			if err := g.ReduceScatterWiden(make([]float32, size*out), make([]float64, out)); err != nil {
				return err
			}
			return g.AllReduce64(make([]float64, out))
		}))
		use := GroupUse{Members: size, SharedMemory: !tcpOnly, ScatterOut: out, ScatterElem: 8, Widen: true}
		for r, w := range worlds {
			g := w.All()
			held := int64(cap(g.tmp) + 8*cap(g.wide) + cap(g.scratch[0]) + cap(g.scratch[1]))
			for _, ring := range []*shmRing{g.tx, g.rx} {
				if ring != nil {
					held += int64(len(ring.mem))
				}
			}
			require.LessOrEqual(t, held, use.Bytes(), "TCP only %v, rank %d", tcpOnly, r)
			require.GreaterOrEqual(t, held, use.Bytes()-chunkBytes, "TCP only %v, rank %d", tcpOnly, r)
		}
	}
}
