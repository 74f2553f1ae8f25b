package status

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/goodput"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

func TestWriteStatusNamesTheIncarnation(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	closed := rendezvous.State{Round: 1, Phase: rendezvous.PhaseClosed, Result: rendezvous.ResultSucceeded, Since: now.Add(-time.Hour)}
	for _, tc := range []struct {
		name string
		st   etcdstore.Status
		want string
	}{
		{"never started", etcdstore.Status{RunID: "x"}, "run x: no rendezvous on this etcd (no agent of this run id has started, or its keys expired)\n"},
		{"starting", etcdstore.Status{RunID: "x", Started: true, Incarnation: 2}, "run x incarnation 2: starting, no round yet\n"},
		{"finished, requeued", etcdstore.Status{RunID: "7", Started: true, Incarnation: 1, Generation: 1, Exists: true, State: closed},
			"run 7 incarnation 1 (SLURM restart 1): round 1 closed since 02:04:05 (1h0m0s ago)\nresult: succeeded\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			New(tc.st).WriteText(&buf, now)
			require.Contains(t, buf.String(), tc.want)
		})
	}
}

// gorun status always lists the job's first failure, however many follow.
func TestWriteFailuresKeepsTheFirst(t *testing.T) {
	mk := func(n int) []rendezvous.Failure {
		var fs []rendezvous.Failure
		for i := range n {
			fs = append(fs, rendezvous.Failure{Host: "node", Rank: i, ExitCode: 1, Error: "boom"})
		}
		return fs
	}
	tests := []struct {
		n          int
		want, skip []string
	}{
		{3, []string{"failures (3, first first):", "rank 0 on node", "rank 2 on node"}, []string{"more"}},
		{8, []string{"failures (8, first first; the first and the last 4):", "rank 0 on node", "... 3 more", "rank 4 on node", "rank 7 on node"},
			[]string{"rank 1 on node", "rank 3 on node"}},
	}
	for _, tc := range tests {
		var b strings.Builder
		writeFailures(&b, mk(tc.n))
		for _, w := range tc.want {
			require.Contains(t, b.String(), w)
		}
		for _, s := range tc.skip {
			require.NotContains(t, b.String(), s)
		}
		require.True(t, strings.HasPrefix(strings.SplitN(b.String(), "\n", 3)[1], "  round 0: rank 0 on node"), b.String())
	}
}

// syntheticStatus is a running job of members nodes node0001... with 8
// workers each, lost of them without a live lease, waiting more nodes
// waiting, two other registered agents, and failures failure reports.
func syntheticStatus(members, lost, waiting, failures int, since time.Time) etcdstore.Status {
	member := func(i int) rendezvous.Member {
		host := fmt.Sprintf("node%04d", i+1)
		return rendezvous.Member{ID: "id-" + host, Host: host, Addr: "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256), NProc: 8, Preferred: i, Since: since}
	}
	st := etcdstore.Status{RunID: "4242", Started: true, Exists: true,
		State: rendezvous.State{Round: 3, Phase: rendezvous.PhaseRunning, Nodes: members, WorldSize: 8 * members,
			MasterAddr: "10.0.0.0", MasterPort: 29500, Reason: "node node0017 lost at 02:03:04.000: lease expired",
			Failures: 2, Changes: 1, Since: since, Limits: rendezvous.Limits{MinNodes: 2, MaxNodes: 8192, MaxFailures: 5, MaxChanges: 10}},
		Roster: rendezvous.Roster{Round: 3},
	}
	gone := map[int]bool{}
	for k := range lost {
		gone[(k*7919+16)%members] = true // distinct: 7919 is prime
	}
	for i := range members {
		m := member(i)
		st.Roster.Members = append(st.Roster.Members, m)
		if !gone[i] {
			st.Nodes = append(st.Nodes, m)
		}
	}
	for i := members; i < members+waiting; i++ {
		st.Waiting = append(st.Waiting, member(i))
		st.Nodes = append(st.Nodes, member(i))
	}
	for i := members + waiting; i < members+waiting+2; i++ {
		st.Nodes = append(st.Nodes, member(i))
	}
	for i := range failures {
		f := rendezvous.Failure{Host: fmt.Sprintf("node%04d", i+1), Rank: 8 * i, NodeRank: i, ExitCode: 1, Error: fmt.Sprintf("failure %d", i), Attempt: i / 4, Time: since}
		if i%3 == 0 {
			f.Rank, f.Error = -1, "lease expired"
		}
		st.Failures = append(st.Failures, f)
	}
	return st
}

// gorun status fits one screen at any job size: counts, the lost and
// waiting nodes, the first failure; a table only for a few members.
func TestWriteStatusFitsOneScreen(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const maxLines, maxColumns = 40, 120
	tests := []struct {
		members, lost, waiting int
		want, skip             []string
	}{
		{3, 1, 2,
			[]string{"members: 3 nodes, 24 workers; 2 alive, 1 lost", "NODE RANK", "node0002  10.0.0.1  8        false",
				"waiting: node0004 (10.0.0.3, 8 workers) since 1m0s ago", "waiting: node0005 ", "others not in the round (2): node[0006-0007]"},
			[]string{"member hosts", "lost ("}},
		{16, 2, 4,
			[]string{"members: 16 nodes, 128 workers; 14 alive, 2 lost", "NODE RANK", "15         node0016  10.0.0.15  8        false",
				"waiting: node0020 ", "others not in the round (2): node[0021-0022]"},
			[]string{"member hosts", "lost (", "waiting ("}},
		{17, 2, 5,
			[]string{"members: 17 nodes, 136 workers; 15 alive, 2 lost", "member hosts (17): node[0001-0017]", "lost (2): node[0014,0017]",
				"waiting (5): node[0018-0022]", "others not in the round (2): node[0023-0024]"},
			[]string{"NODE RANK", "waiting: "}},
		{4096, 6, 40,
			[]string{"members: 4096 nodes, 32768 workers; 4090 alive, 6 lost", "agents: 4132 with a live lease; 40 waiting for the next round, 2 others not in the round",
				"member hosts (4096): node[0001-4096]\n", "lost (6): node[", "waiting (40): node[4097-4136]\n", "others not in the round (2): node[4137-4138]"},
			[]string{"NODE RANK", "waiting: ", "] ... "}},
	}
	for _, tc := range tests {
		t.Run(strconv.Itoa(tc.members), func(t *testing.T) {
			var b strings.Builder
			New(syntheticStatus(tc.members, tc.lost, tc.waiting, 10, now.Add(-time.Minute))).WriteText(&b, now)
			out := b.String()
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			require.LessOrEqual(t, len(lines), maxLines, out)
			for _, l := range lines {
				if !strings.HasPrefix(l, "  round ") { // a failure's line holds its error's first line
					require.LessOrEqual(t, len(l), maxColumns, l)
				}
			}
			common := []string{
				"run 4242 incarnation 0: round 3 running since 03:03:05 (1m0s ago)\n",
				"reason: node node0017 lost at",
				"nodes: 2..8192; restarts used: 2 of 5 after worker failures, 1 of 10 after membership changes\n",
				"master: 10.0.0.0:29500\n",
				"failures (10, first first; the first and the last 4):\n  round 0: node node0001 lost at",
				"... 5 more", "round 2: rank 64 on node0009 (node 8): exit 1",
				"all members, waiting nodes and failures: gorun status --json\n",
			}
			for _, w := range append(common, tc.want...) {
				require.Contains(t, out, w)
			}
			for _, s := range tc.skip {
				require.NotContains(t, out, s)
			}
		})
	}
}

// A joinable round has no members yet: status counts the registered
// agents and lists them as hostlists.
func TestWriteStatusJoinable(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	st := syntheticStatus(4096, 6, 40, 0, now)
	st.State.Round, st.State.Phase = 4, rendezvous.PhaseJoinable
	var b strings.Builder
	New(st).WriteText(&b, now)
	out := b.String()
	for _, want := range []string{
		"round 4 joinable since", "members: none yet (round 4 is joinable)\n", "agents: 4132 with a live lease; 40 waiting for the next round\n",
		"waiting (40): node[4097-4136]\n", "registered, not waiting (4092): node[0001-0016,0018-2747,",
	} {
		require.Contains(t, out, want)
	}
	require.NotContains(t, out, "NODE RANK")
	require.NotContains(t, out, "master:")
}

// Hosts that do not compress are cut to one line, saying how many are
// left out.
func TestWriteStatusCutsLongHostlists(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	st := syntheticStatus(4096, 6, 0, 0, now)
	for i := range st.Roster.Members {
		st.Roster.Members[i].Host = fmt.Sprintf("gpu-%x.example", i*7919)
	}
	var b strings.Builder
	New(st).WriteText(&b, now)
	out := b.String()
	require.Regexp(t, `\nmember hosts \(4096\): gpu-0\.example,gpu-1[0-9a-f]*\.example,[^\n]* \.\.\. \d+ more\n`, out)
	require.Regexp(t, `\nlost \(6\): (gpu-[0-9a-f]+\.example,){4}gpu-[0-9a-f]+\.example \.\.\. 1 more\n`, out)
	require.Contains(t, out, "all members, waiting nodes and failures: gorun status --json\n")
	require.LessOrEqual(t, strings.Count(out, "\n"), 40, out)
}

func TestShortHostlist(t *testing.T) {
	tests := []struct {
		hosts []string
		width int
		want  string
		shown int
	}{
		{[]string{"n10", "n9", "n1", "login"}, 100, "login,n[1,9-10]", 4},
		{[]string{"node0003", "node0001", "node0002", "node0007"}, 100, "node[0001-0003,0007]", 4},
		{[]string{"a1", "b1", "c1", "d1"}, 5, "a1,b1", 2},
		{[]string{"averylonghostname"}, 5, "averylonghostname", 1},
		{nil, 5, "", 0},
	}
	for _, tc := range tests {
		list, shown := shortHostlist(tc.hosts, tc.width)
		require.Equal(t, tc.want, list, tc.hosts)
		require.Equal(t, tc.shown, shown, tc.hosts)
	}
}

// gorun status --json: every member with its node rank, first global rank
// and liveness, under the field names the command's help documents.
func TestStatusJSON(t *testing.T) {
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	out, err := json.Marshal(New(syntheticStatus(17, 2, 5, 10, since)))
	require.NoError(t, err)
	var got struct {
		Round   int    `json:"round"`
		Phase   string `json:"phase"`
		Members []struct {
			NodeRank  int    `json:"node_rank"`
			FirstRank int    `json:"first_rank"`
			Host      string `json:"host"`
			NProc     int    `json:"nproc"`
			Alive     bool   `json:"alive"`
		} `json:"members"`
		Waiting  []struct{ Host string } `json:"waiting"`
		Others   []struct{ Host string } `json:"others"`
		Failures []rendezvous.Failure    `json:"failures"`
		Counts   map[string]int          `json:"counts"`
		Budgets  map[string]int          `json:"budgets"`
	}
	require.NoError(t, json.Unmarshal(out, &got))
	require.Equal(t, 3, got.Round)
	require.Equal(t, "running", got.Phase)
	require.Len(t, got.Members, 17)
	for i, m := range got.Members {
		require.Equal(t, i, m.NodeRank)
		require.Equal(t, 8*i, m.FirstRank)
		require.Equal(t, fmt.Sprintf("node%04d", i+1), m.Host)
		require.Equal(t, i != 13 && i != 16, m.Alive, m.Host)
	}
	require.Len(t, got.Waiting, 5)
	require.Len(t, got.Others, 2)
	require.Len(t, got.Failures, 10)
	require.Equal(t, map[string]int{"members": 17, "workers": 136, "alive": 15, "lost": 2, "registered": 22, "waiting": 5, "others": 2, "failures": 10, "in_place": 0}, got.Counts)
	require.Equal(t, map[string]int{"min_nodes": 2, "max_nodes": 8192, "failure_restarts": 2, "max_failure_restarts": 5, "change_restarts": 1, "max_change_restarts": 10}, got.Budgets)

	// Every field is documented in the help.
	var fields map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(out, &fields))
	for name := range fields {
		require.Contains(t, Description, name)
	}
	for _, sub := range []string{"counts", "budgets"} {
		var inner map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(fields[sub], &inner))
		for name := range inner {
			require.Contains(t, Description, name)
		}
	}
	var members []map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(fields["members"], &members))
	for name := range members[0] {
		require.Contains(t, Description, name)
	}
}

// A job that has not started or is joinable gives empty lists in JSON,
// never null.
func TestStatusJSONEmptyLists(t *testing.T) {
	for _, st := range []etcdstore.Status{
		{RunID: "x"},
		{RunID: "x", Started: true, Exists: true, State: rendezvous.State{Round: 1, Phase: rendezvous.PhaseJoinable}, Roster: rendezvous.Roster{Round: 0, Members: []rendezvous.Member{{ID: "a"}}}},
	} {
		out, err := json.Marshal(New(st))
		require.NoError(t, err)
		require.Contains(t, string(out), `"members":[],"waiting":[],"others":[],"failures":[]`)
	}
}

// In-place recoveries are counted apart from restarts, the last one
// described, in the text and in --json.
func TestStatusInPlaceRecoveries(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	st := syntheticStatus(3, 0, 0, 0, now)
	st.Recoveries = []rendezvous.Recovery{
		{Round: 1, Host: "node0001", Lost: []string{"node0004"}, Nodes: 3, Workers: 24, AtStep: 12, Seconds: 0.8},
		{Round: 3, Host: "node0001", Lost: []string{"c"}, Nodes: 2, Workers: 4, AtStep: 41, StepsLost: 1, Seconds: 1.25},
	}
	var b strings.Builder
	New(st).WriteText(&b, now)
	require.Contains(t, b.String(), "in-place recoveries (workers kept, not restarted): 2; last: round 3: node c lost at step 41; in place on 2 nodes (4 workers), 1 steps lost, 1.2 s\n"+
		"time lost in them: 2.0 s (each round's end to its first step), 1 steps redone\n")

	out, err := json.Marshal(New(st))
	require.NoError(t, err)
	var got struct {
		Counts     map[string]int        `json:"counts"`
		Recoveries []rendezvous.Recovery `json:"recoveries"`
		Lost       map[string]float64    `json:"lost"`
	}
	require.NoError(t, json.Unmarshal(out, &got))
	require.Equal(t, 2, got.Counts["in_place"])
	require.Equal(t, st.Recoveries, got.Recoveries)
	require.InDelta(t, 2.05, got.Lost["in_place_seconds"], 1e-9)
	require.Equal(t, map[string]float64{"in_place_seconds": got.Lost["in_place_seconds"], "in_place_steps": 1}, got.Lost)
}

// The job's goodput, from what its agents published, is two lines of the
// text and the goodput object of --json, whose fields the help
// documents.
func TestStatusGoodput(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	st := syntheticStatus(3, 0, 0, 0, now)
	tally := goodput.Tally{}
	for s := range 5 {
		tally = tally.Apply(goodput.StepAt(now.Add(time.Duration(s) * time.Second)))
	}
	tally = tally.Apply(goodput.Event{Kind: goodput.Left, At: now.Add(5 * time.Second)}).
		Apply(goodput.Event{Kind: goodput.Ended, Cause: goodput.Node}).
		Apply(goodput.Event{Kind: goodput.Formed, At: now.Add(6 * time.Second)}).
		Apply(goodput.Event{Kind: goodput.Step, At: now.Add(8 * time.Second), StateS: 1, Redone: 0})
	st.Goodput = map[string][]byte{
		"id-1": goodput.NodeReport{Host: "node0001", At: now, Summary: tally.Summary(now.Add(8 * time.Second))}.Encode(),
		"id-2": goodput.NodeReport{Host: "node0002", At: now, Summary: tally.Summary(now.Add(8 * time.Second))}.Encode(),
	}
	var b strings.Builder
	New(st).WriteText(&b, now)
	require.Contains(t, b.String(), "goodput: 0.500 (effective 8.0 of 16.0 node-seconds, 2 nodes); 1 recoveries, 0 steps redone\n"+
		"time lost: 8.0 node-seconds: node 8.0; detection 2.0, rendezvous 2.0, state transfer 2.0, first step 2.0\n")

	out, err := json.Marshal(New(st))
	require.NoError(t, err)
	var got struct {
		Goodput map[string]json.RawMessage `json:"goodput"`
	}
	require.NoError(t, json.Unmarshal(out, &got))
	for name := range got.Goodput {
		require.Contains(t, Description, name)
	}
	var nodes []map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(got.Goodput["nodes"], &nodes))
	require.Len(t, nodes, 2)
	for name := range nodes[0] {
		require.Contains(t, Description, name)
	}
	require.JSONEq(t, `{"worker":0,"node":8,"network":0,"straggler":0,"restart":0}`, string(got.Goodput["lost_by_cause"]))
}

// WriteJSON (gorun status --json) writes the report's JSON, two spaces an
// indent, one object and a newline.
func TestWriteJSON(t *testing.T) {
	rep := New(syntheticStatus(3, 1, 1, 2, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
	var b bytes.Buffer
	require.NoError(t, rep.WriteJSON(&b))
	want, err := json.MarshalIndent(rep, "", "  ")
	require.NoError(t, err)
	require.Equal(t, string(want)+"\n", b.String())
}

// Read is the report of what its reader read, or the reader's error.
func TestRead(t *testing.T) {
	failed := errors.New("etcd: no answer")
	st := syntheticStatus(2, 0, 0, 1, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	for _, tc := range []struct {
		name string
		st   etcdstore.Status
		err  error
	}{
		{"read", st, nil},
		{"failed", etcdstore.Status{}, failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Read(context.Background(), func(context.Context) (etcdstore.Status, error) { return tc.st, tc.err })
			require.ErrorIs(t, err, tc.err)
			if tc.err == nil {
				require.Equal(t, New(tc.st), rep)
			}
		})
	}
}
