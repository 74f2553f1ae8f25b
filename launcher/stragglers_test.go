package launcher

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/straggler"
)

// TestLogStragglers: an agent logs its own ranks only, once when one
// becomes a straggler and once when it no longer is.
func TestLogStragglers(t *testing.T) {
	own := straggler.Report{Node: "node-b", Ranks: []straggler.RankCompute{{Rank: 2, ComputeS: 0.4}, {Rank: 3, ComputeS: 0.1}}}
	slow := []straggler.Straggler{{Rank: 2, Node: "node-b", Ratio: 4}, {Rank: 0, Node: "node-a", Ratio: 2}}
	for _, tc := range []struct {
		name   string
		found  []straggler.Straggler
		before map[int]bool
		logged []string
		now    map[int]bool
	}{
		{name: "healthy", before: map[int]bool{}, now: map[int]bool{}},
		{name: "becomes slow; another node's rank is not this agent's to log", found: slow, before: map[int]bool{},
			logged: []string{"straggler: rank 2 on node-b, 4.0x the median step compute"}, now: map[int]bool{2: true}},
		{name: "still slow: logged already", found: slow, before: map[int]bool{2: true}, now: map[int]bool{2: true}},
		{name: "recovers", before: map[int]bool{2: true}, logged: []string{"rank no longer a straggler"}, now: map[int]bool{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			now := logStragglers(zerolog.New(&buf), own, tc.found, tc.before)
			require.Equal(t, tc.now, now)
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			if len(tc.logged) == 0 {
				require.Empty(t, strings.TrimSpace(buf.String()))
				return
			}
			require.Len(t, lines, len(tc.logged))
			for i, want := range tc.logged {
				require.Contains(t, lines[i], want)
			}
		})
	}
}

func TestOwnStraggler(t *testing.T) {
	own := straggler.Report{Node: "a", Ranks: []straggler.RankCompute{{Rank: 2, ComputeS: 0.3}, {Rank: 3, ComputeS: 0.4}}}
	found := []straggler.Straggler{{Rank: 5, Ratio: 3}, {Rank: 2, Ratio: 1.6}, {Rank: 3, Ratio: 2.1}}
	worst, ok := ownStraggler(own, found)
	require.True(t, ok)
	require.Equal(t, 3, worst.Rank)
	_, ok = ownStraggler(own, found[:1])
	require.False(t, ok, "another node's straggler is not this node's")
}
