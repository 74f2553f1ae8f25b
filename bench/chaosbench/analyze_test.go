package main

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/trainer/metrics"
)

// TestAnalyze: a worker killed after step 10 (round 0, a step every 100 ms) and a restart from
// the checkpoint of step 5 that records step 6 again 1.1 s after step 10 (round 1): 1.1 s
// down, 5 steps lost; 15 steps kept, worth 1.5 s of the 3 s of training.
func TestAnalyze(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	w, err := metrics.Open(path, 0)
	require.NoError(t, err)
	for s := 1; s <= 10; s++ {
		require.NoError(t, w.Write(metrics.Record{Step: s, Time: at(0.1 * float64(s-1)), WorldSize: 8, Round: 0}))
	}
	for s := 6; s <= 15; s++ {
		require.NoError(t, w.Write(metrics.Record{Step: s, Time: at(2 + 0.1*float64(s-6)), WorldSize: 8, Round: 1}))
	}
	require.NoError(t, w.Close())
	j := &job{metrics: path, faults: []fault{
		{Kind: kindWorker, At: at(0.95), Victim: "a worker"},
		{Kind: kindAggregator, At: at(1), Skipped: "no leader key"},
		{Kind: kindNode, At: at(2.95), Victim: "node1"}, // nothing after it
	}}
	s, err := analyze(j)
	require.NoError(t, err)
	require.Equal(t, 20, s.Records)
	require.Equal(t, 15, s.Kept)
	require.Equal(t, 15, s.LastStep)
	require.Equal(t, 100*time.Millisecond, s.StepTime)
	require.Equal(t, 3*time.Second, s.Window)
	require.Equal(t, 1500*time.Millisecond, s.KeptTime)
	require.InDelta(t, 0.5, s.Effective(), 1e-9)
	require.Len(t, s.Costs, 2, "the skipped fault is not costed")
	require.Equal(t, 1100*time.Millisecond, s.Costs[0].Downtime)
	require.Equal(t, 5, s.Costs[0].Lost)
	require.True(t, s.Costs[1].Unrecovered)

	require.Empty(t, s.Joins, "the world did not grow")

	rows := byKind(s.Costs)
	require.Equal(t, []kindRow{
		{Kind: kindWorker, N: 1, DowntimeMed: 1.1, DowntimeMax: 1.1, StepsLost: 5, LostMax: 5},
		{Kind: kindNode, N: 1, Unrecovered: 1},
	}, rows)
}

// TestAnalyzeJoins: a round that makes the world larger (a node taken in) is a join, whose
// pause is its last record before to its first; a round that makes it smaller is not.
func TestAnalyzeJoins(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	w, err := metrics.Open(path, 0)
	require.NoError(t, err)
	for i, r := range []metrics.Record{
		{Step: 1, Time: at(0), WorldSize: 6, Round: 0},
		{Step: 2, Time: at(0.1), WorldSize: 6, Round: 0},
		{Step: 3, Time: at(1.1), WorldSize: 4, Round: 1}, // a node lost
		{Step: 4, Time: at(1.2), WorldSize: 4, Round: 1},
		{Step: 5, Time: at(1.5), WorldSize: 6, Round: 2}, // a node taken in: 0.3 s
		{Step: 6, Time: at(1.6), WorldSize: 6, Round: 2},
	} {
		require.NoError(t, w.Write(r), "record %d", i)
	}
	require.NoError(t, w.Close())
	s, err := analyze(&job{metrics: path})
	require.NoError(t, err)
	require.Len(t, s.Joins, 1)
	require.InDelta(t, 0.3, s.Joins[0].Seconds(), 1e-9)
}

// TestAnalyzeBystander: an etcd leader killed with a node that was no member (a spare) stops
// no round; its cost is the stall of training across it (here 0.5 s between steps 3 and 4),
// not the time to some later round.
func TestAnalyzeBystander(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	w, err := metrics.Open(path, 0)
	require.NoError(t, err)
	for i, r := range []metrics.Record{
		{Step: 1, Time: at(0), WorldSize: 8, Round: 0},
		{Step: 2, Time: at(0.1), WorldSize: 8, Round: 0},
		{Step: 3, Time: at(0.2), WorldSize: 8, Round: 0},
		{Step: 4, Time: at(0.7), WorldSize: 8, Round: 0},
		{Step: 5, Time: at(5), WorldSize: 8, Round: 1}, // a later round, for another reason
	} {
		require.NoError(t, w.Write(r), "record %d", i)
	}
	require.NoError(t, w.Close())
	s, err := analyze(&job{metrics: path, faults: []fault{{Kind: kindEtcdLeader, At: at(0.25), Bystander: true}}})
	require.NoError(t, err)
	require.Len(t, s.Costs, 1)
	require.False(t, s.Costs[0].Unrecovered)
	require.InDelta(t, 0.5, s.Costs[0].Downtime.Seconds(), 1e-9)
	require.Zero(t, s.Costs[0].Lost)
}
