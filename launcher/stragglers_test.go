package launcher

import (
	"time"

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

func TestEvictionClock(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	type look struct {
		at         int // seconds
		straggling bool
		evict      bool
	}
	for _, tc := range []struct {
		name  string
		looks []look
	}{
		{"never a straggler", []look{{0, false, false}, {2, false, false}, {100, false, false}}},
		{"a straggler for the whole period", []look{{0, true, false}, {2, true, false}, {9, true, false}, {10, true, true}}},
		{"a break starts the period again", []look{{0, true, false}, {8, false, false}, {10, true, false}, {18, true, false}, {20, true, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := evictionClock{after: 10 * time.Second}
			for _, l := range tc.looks {
				require.Equal(t, l.evict, c.observe(at(l.at), l.straggling), "at %d s", l.at)
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
