package agentmetrics

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/internal/snapshot"
	"github.com/gorun/gorun/rendezvous"
)

// The snapshot series: each current rank's newest complete step, read
// from its slot headers at scrape time; the copies on peers; and the
// recoveries (the step restored, the steps redone, how many restored and
// how many could not). The job's first agreement, with nothing held, is no
// recovery. Without a snapshot directory there is no series.
func TestSnapshotMetrics(t *testing.T) {
	dir := t.TempDir()
	m, err := New(Config{RunID: "7", Node: "a", SnapshotDir: dir, Now: (&fixedClock{time.Unix(0, 0)}).now})
	require.NoError(t, err)
	r := rendezvous.Round{Number: 1, NumNodes: 2, WorldSize: 4, FirstRank: 2}
	m.RoundStarted(r, time.Second)
	m.WorkerStarted(workerOf(1, 0))
	m.WorkerStarted(workerOf(1, 1))
	m.SnapshotsAgreed(r, elastic.SnapshotRecovery{Reason: "no snapshot yet"})
	for _, step := range []uint64{6, 7} {
		s, err := snapshot.OpenRank(dir, 2)
		require.NoError(t, err)
		require.NoError(t, s.Write(snapshot.Header{Step: step, World: 4, Length: 3}, bytes.NewReader([]byte("abc"))))
		require.NoError(t, s.Close())
	}
	m.SnapshotReplicated(2, 7, "10.0.0.9:5000")
	m.SnapshotsAgreed(r, elastic.SnapshotRecovery{Restored: true, Step: 5, Newest: 6, Held: true})
	m.SnapshotsAgreed(r, elastic.SnapshotRecovery{Held: true, Newest: 7, Reason: "rank 3's snapshots are gone"})
	m.SnapshotReplicated(2, 7, "10.0.0.2:5000") // the copies of the round before are forgotten
	text := scrape(t, m)
	var ours []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "gorun_snapshot_") {
			ours = append(ours, l)
		}
	}
	for _, want := range []string{
		`gorun_snapshot_step{node="a",rank="2",run_id="7"} 7`,
		`gorun_snapshot_replica_step{node="a",peer="10.0.0.2:5000",rank="2",run_id="7"} 7`,
		`gorun_snapshot_restored_step{node="a",run_id="7"} 5`,
		`gorun_snapshot_steps_redone_total{node="a",run_id="7"} 1`,
		`gorun_snapshot_recoveries_total{node="a",result="restored",run_id="7"} 1`,
		`gorun_snapshot_recoveries_total{node="a",result="none",run_id="7"} 1`,
	} {
		require.Contains(t, ours, want)
	}
	require.Len(t, ours, 6, "rank 3 has no snapshot yet, and one copy is on a peer: %v", ours)

	plain, err := New(Config{RunID: "7", Node: "a"})
	require.NoError(t, err)
	require.False(t, strings.Contains(scrape(t, plain), "gorun_snapshot_"), "no directory: no snapshot series")
}
