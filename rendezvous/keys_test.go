package rendezvous

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestKeyShapes: every kind of key is written as the job's keys have
// always been written (agents of different builds share an etcd across a
// requeue, and gorun status reads a finished job's keys), and ParseKey
// reads each back to the same Key.
func TestKeyShapes(t *testing.T) {
	peer := 7
	for _, tc := range []struct {
		name string
		key  string
		want Key
	}{
		{"state", KeyState, Key{Kind: KindState}},
		{"leader", KeyLeader, Key{Kind: KindLeader}},
		{"roster", KeyRoster, Key{Kind: KindRoster}},
		{"place", placeKey(3), Key{Kind: KindPlace, Bucket: 3}},
		{"place over 99", placeKey(123), Key{Kind: KindPlace, Bucket: 123}},
		{"node", nodeKey("node-a.11"), Key{Kind: KindNode, ID: "node-a.11"}},
		{"waiting", waitKey("node-a.11"), Key{Kind: KindWaiting, ID: "node-a.11"}},
		{"join", joinKey(4, "node-a.11"), Key{Kind: KindJoin, Round: 4, ID: "node-a.11"}},
		{"done", doneKey(4, "node-a.11"), Key{Kind: KindDone, Round: 4, ID: "node-a.11"}},
		{"stall", stallKey(4, "node-a.11"), Key{Kind: KindStall, Round: 4, ID: "node-a.11"}},
		{"unreach", unreachKey(4, "node-a.11"), Key{Kind: KindUnreach, Round: 4, ID: "node-a.11"}},
		{"exchange", exchangeKey(4, "node-a.11"), Key{Kind: KindExchange, Round: 4, ID: "node-a.11"}},
		{"lost node", nodeFailureKey(5, "node-a.11"), Key{Kind: KindFailure, Round: 5, ID: "node-a.11"}},
		{"failed agent", agentFailureKey(5, "node-a.11"), Key{Kind: KindFailure, Round: 5, ID: "node-a.11", Agent: true}},
		{"worker", failureKey(5, Failure{Rank: 12}), Key{Kind: KindFailure, Round: 5, Class: 1, Rank: 12}},
		{"worker naming a lost peer", failureKey(5, Failure{Rank: 12, LostPeer: &peer}), Key{Kind: KindFailure, Round: 5, Class: 2, Rank: 12}},
		{"in place", keptKey(6), Key{Kind: KindKept, Round: 6}},
		{"stats", StatsKey("node-a.11"), Key{Kind: KindStats, ID: "node-a.11"}},
		{"goodput", GoodputKey("node-a.11"), Key{Kind: KindGoodput, ID: "node-a.11"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseKey(tc.key)
			require.True(t, ok, tc.key)
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.key, got.String())
		})
	}
	// The literal shapes, as etcd holds them.
	for key, want := range map[string]string{
		placeKey(3):                      "place/03",
		joinKey(4, "a"):                  "rounds/00000004/join/a",
		doneKey(4, "a"):                  "rounds/00000004/done/a",
		stallKey(4, "a"):                 "rounds/00000004/stall/a",
		unreachKey(4, "a"):               "rounds/00000004/unreach/a",
		exchangeKey(4, "a"):              "rounds/00000004/exchange/a",
		nodeFailureKey(5, "a"):           "failures/00000005/0-node-a",
		agentFailureKey(5, "a"):          "failures/00000005/0-agent-a",
		failureKey(5, Failure{Rank: 12}): "failures/00000005/1-00000012",
		keptKey(6):                       "inplace/00000006",
		nodeKey("a"):                     "nodes/a",
		waitKey("a"):                     "waiting/a",
		StatsKey("a"):                    "stats/a",
		GoodputKey("a"):                  "goodput/a",
	} {
		require.Equal(t, want, key)
	}
}

// TestParseKeyRejects: keys outside the schema, or malformed, are no key.
func TestParseKeyRejects(t *testing.T) {
	for _, key := range []string{"", "states", "place/x", "rounds/x/join/a", "rounds/00000001/left/a", "rounds/00000001",
		"failures/x/0-node-a", "failures/00000001/0-00000003", "failures/00000001/1-x", "inplace/x", "other/a"} {
		_, ok := ParseKey(key)
		require.False(t, ok, key)
	}
}

// TestDecodeByKind: Decode returns each kind's value type, and fails on a
// value that is not one.
func TestDecodeByKind(t *testing.T) {
	member := Member{ID: "a", Host: "node-a", NProc: 2}
	mdata, err := json.Marshal(member)
	require.NoError(t, err)
	roster, err := Roster{Round: 3, Members: []Member{member}}.Encode()
	require.NoError(t, err)
	for _, tc := range []struct {
		key   string
		value []byte
		want  any
	}{
		{KeyState, []byte(`{"round":2}`), State{Round: 2}},
		{KeyLeader, []byte("a"), "a"},
		{KeyRoster, roster, Roster{Round: 3, Members: []Member{member}}},
		{nodeKey("a"), mdata, member},
		{waitKey("a"), mdata, member},
		{joinKey(3, "a"), mdata, member},
		{doneKey(3, "a"), []byte("node-a"), "node-a"},
		{unreachKey(3, "a"), []byte(`["b","c"]`), []string{"b", "c"}},
		{nodeFailureKey(3, "a"), []byte(`{"host":"node-a"}`), Failure{Host: "node-a", Revision: 9}},
		{keptKey(3), []byte(`{"round":3}`), Recovery{Round: 3}},
		{exchangeKey(3, "a"), []byte(`{"node_rank":2,"value":"aGk="}`), Exchanged{NodeRank: 2, Value: []byte("hi")}},
		{StatsKey("a"), []byte("raw"), []byte("raw")},
	} {
		t.Run(tc.key, func(t *testing.T) {
			k, ok := ParseKey(tc.key)
			require.True(t, ok)
			got, err := Decode(k, KV{Key: tc.key, Value: tc.value, Create: 9})
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			if k.Kind != KindLeader && k.Kind != KindDone && k.Kind != KindStats {
				_, err = Decode(k, KV{Key: tc.key, Value: []byte("{not json")})
				require.Error(t, err)
			}
		})
	}
}
