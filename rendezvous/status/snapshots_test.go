package status

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/straggler"
)

// A node's snapshots travel in its stats value beside its straggler
// report (which still parses), and gorun status shows them per member: a
// line of the text and the member's snapshots object in --json. A value
// without them, or not JSON, has none.
func TestStatusSnapshots(t *testing.T) {
	snaps := &Snapshots{
		Ranks:    []RankSnapshot{{Rank: 2, Step: 57, Replicas: []Replica{{Peer: "10.0.0.3:4100", Step: 56}}}},
		Recovery: &SnapshotRecovery{Round: 1, Restored: true, Step: 50, Newest: 51, Redone: 1},
	}
	report := straggler.Report{Node: "node0001", Ranks: []straggler.RankCompute{{Rank: 2, ComputeS: 0.5}}}
	value, err := WithSnapshots(report.Encode(), snaps)
	require.NoError(t, err)
	back, err := straggler.ParseReport(value)
	require.NoError(t, err)
	require.Equal(t, report, back, "the straggler report is untouched")
	require.Equal(t, snaps, ParseSnapshots(value))
	require.Nil(t, ParseSnapshots(report.Encode()))
	require.Nil(t, ParseSnapshots([]byte("not json")))
	same, err := WithSnapshots(report.Encode(), nil)
	require.NoError(t, err)
	require.Equal(t, report.Encode(), same)
	_, err = WithSnapshots([]byte("[1]"), snaps)
	require.Error(t, err)

	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	st := syntheticStatus(3, 0, 0, 0, now)
	id := st.Roster.Members[1].ID
	st.Stats = map[string][]byte{id: value}
	var b strings.Builder
	New(st).WriteText(&b, now)
	require.Contains(t, b.String(), "snapshots on "+st.Roster.Members[1].Host+": rank 2 at step 57 (copies: 10.0.0.3:4100 at 56); restored step 50 in round 1, 1 steps redone\n")

	out, err := json.Marshal(New(st))
	require.NoError(t, err)
	var got struct {
		Members []struct {
			Snapshots *Snapshots `json:"snapshots"`
		} `json:"members"`
	}
	require.NoError(t, json.Unmarshal(out, &got))
	require.Nil(t, got.Members[0].Snapshots)
	require.Equal(t, snaps, got.Members[1].Snapshots)

	none := Snapshots{Recovery: &SnapshotRecovery{Round: 2, Reason: "rank 1's snapshots are gone"}}
	require.Equal(t, "none yet; round 2 restored nothing: rank 1's snapshots are gone", none.String())
}
