package straggler

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/heartbeat"
)

func TestWindowMedian(t *testing.T) {
	for _, tc := range []struct {
		name  string
		times []float64
		want  float64
	}{
		{name: "empty", want: math.NaN()},
		{name: "odd", times: []float64{0.3, 0.1, 0.2}, want: 0.2},
		{name: "even", times: []float64{0.1, 0.4, 0.2, 0.3}, want: 0.25},
		{name: "not reported and nonsense ignored", times: []float64{math.NaN(), -1, math.Inf(1), 0.5}, want: 0.5},
		{name: "only the latest steps", times: []float64{9, 9, 9, 9, 9, 9, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w Window
			for _, s := range tc.times {
				w.Add(s)
			}
			if math.IsNaN(tc.want) {
				require.True(t, math.IsNaN(w.Median()))
				return
			}
			require.InDelta(t, tc.want, w.Median(), 1e-12)
		})
	}
}

func TestFind(t *testing.T) {
	nodeA := Report{Node: "node-a", Ranks: []RankCompute{{0, 0.10}, {1, 0.11}}}
	for _, tc := range []struct {
		name    string
		reports []Report
		want    []string
	}{
		{name: "none reported"},
		{name: "one rank has no peers", reports: []Report{{Node: "node-a", Ranks: []RankCompute{{0, 1}}}}},
		{
			name:    "a job of two: the slow one only",
			reports: []Report{{Node: "node-a", Ranks: []RankCompute{{0, 0.1}}}, {Node: "node-b", Ranks: []RankCompute{{1, 0.2}}}},
			want:    []string{"rank 1 on node-b, 2.0x the median step compute"},
		},
		{
			name:    "peers that report no compute name none",
			reports: []Report{{Node: "a", Ranks: []RankCompute{{0, 0}, {1, 0}, {2, 0.5}}}},
		},
		{name: "healthy job", reports: []Report{nodeA, {Node: "node-b", Ranks: []RankCompute{{2, 0.12}, {3, 0.10}}}}},
		{
			name:    "one slow rank",
			reports: []Report{nodeA, {Node: "node-b", Ranks: []RankCompute{{2, 0.10}, {3, 0.19}}}},
			want:    []string{"rank 3 on node-b, 1.9x the median step compute"}, // 0.19 / its peers' 0.10

		},
		{
			name:    "at the factor exactly",
			reports: []Report{{Node: "a", Ranks: []RankCompute{{0, 0.25}, {1, 0.25}, {2, 0.375}}}},
			want:    []string{"rank 2 on a, 1.5x the median step compute"},
		},
		{name: "just under the factor", reports: []Report{{Node: "a", Ranks: []RankCompute{{0, 0.25}, {1, 0.25}, {2, 0.37}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, s := range Find(tc.reports) {
				got = append(got, s.String())
			}
			require.Equal(t, tc.want, got)
		})
	}
}

func TestReportRoundTrips(t *testing.T) {
	r := Report{Node: "node-b", Ranks: []RankCompute{{2, 0.1}, {3, 0.25}}}
	got, err := ParseReport(r.Encode())
	require.NoError(t, err)
	require.Equal(t, r, got)
	_, err = ParseReport([]byte("{"))
	require.ErrorContains(t, err, "straggler: report")
}

// TestTrackerForgetsOldWorkers: a restarted local rank starts a new
// window, and a late time of the old worker (another rank) is ignored.
func TestTrackerForgetsOldWorkers(t *testing.T) {
	tr := NewTracker()
	require.Empty(t, tr.Report("a").Ranks)
	tr.Started(0, 4)
	tr.Started(1, 5)
	tr.Observe(0, 4, heartbeat.Progress{ComputeS: 0.9})
	tr.Observe(1, 5, heartbeat.Progress{ComputeS: 0.1})
	require.Equal(t, []RankCompute{{4, 0.9}, {5, 0.1}}, tr.Report("a").Ranks)
	tr.Started(0, 2)
	tr.Observe(0, 4, heartbeat.Progress{ComputeS: 0.9})
	tr.Observe(0, 2, heartbeat.Progress{ComputeS: 0.2})
	tr.Observe(7, 7, heartbeat.Progress{ComputeS: 1}) // never started
	require.Equal(t, []RankCompute{{2, 0.2}, {5, 0.1}}, tr.Report("a").Ranks)
}

// TestTrackerReportsLatestProgress: Observe feeds the compute window and keeps each
// rank's last figures, which Report carries and Latest picks (the newest step, lowest rank); a
// figure not reported stays out, and an old worker's heartbeat is ignored.
func TestTrackerReportsLatestProgress(t *testing.T) {
	tr := NewTracker()
	tr.Started(0, 4)
	tr.Started(1, 5)
	tr.Observe(0, 4, heartbeat.Progress{Step: 11, Loss: 3.5, TokensPerS: 900, ComputeS: 0.3})
	tr.Observe(0, 4, heartbeat.Progress{Step: 12, Loss: 3.25, TokensPerS: 1000, ComputeS: 0.3})
	tr.Observe(1, 5, heartbeat.Progress{Step: 12, Loss: math.NaN(), TokensPerS: math.NaN(), ComputeS: 0.1})
	tr.Observe(1, 9, heartbeat.Progress{Step: 99, Loss: 1, ComputeS: 5}) // not local rank 1's worker
	rep := tr.Report("a")
	require.Equal(t, []RankCompute{{4, 0.3}, {5, 0.1}}, rep.Ranks)
	require.Equal(t, []RankProgress{{Rank: 4, Step: 12, Loss: 3.25, TokensPerS: 1000}, {Rank: 5, Step: 12}}, rep.Progress)
	got, err := ParseReport(rep.Encode())
	require.NoError(t, err)
	require.Equal(t, rep, got)
	latest, ok := rep.Latest()
	require.True(t, ok)
	require.Equal(t, RankProgress{Rank: 4, Step: 12, Loss: 3.25, TokensPerS: 1000}, latest)
	tr.Observe(1, 5, heartbeat.Progress{Step: 13, Loss: 3, TokensPerS: math.Inf(1), ComputeS: 0.1})
	latest, _ = tr.Report("a").Latest()
	require.Equal(t, RankProgress{Rank: 5, Step: 13, Loss: 3}, latest)
	_, ok = Report{Node: "old agent", Ranks: rep.Ranks}.Latest()
	require.False(t, ok)
}
