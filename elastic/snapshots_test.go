package elastic

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/snapshot"
	"github.com/gorun/gorun/rendezvous"
)

// writeSlot stores a snapshot of rank at step (world, replicated or not)
// in dir, with a payload that names them.
func writeSlot(t *testing.T, dir string, rank, world int, step uint64, replicated bool) {
	t.Helper()
	s, err := snapshot.OpenRank(dir, rank)
	require.NoError(t, err)
	defer s.Close()
	h := snapshot.Header{Step: step, World: world}
	if replicated {
		h.Flags = snapshot.FlagReplicated
	}
	p := payloadOf(rank, step)
	h.Length = uint64(len(p))
	require.NoError(t, s.Write(h, bytes.NewReader(p)))
}

// writeDurable stores, as internal/snapshot/durable.Persist would, a
// snapshot of each of ranks at step (sharded, world) in the durable
// directory dst: dst/step-<12 digits>/rank-<R>.slot.
func writeDurable(t *testing.T, dst string, world int, step uint64, ranks ...int) {
	t.Helper()
	stepDir := filepath.Join(dst, fmt.Sprintf("step-%012d", step))
	require.NoError(t, os.MkdirAll(stepDir, 0o700))
	for _, rank := range ranks {
		tmp := t.TempDir()
		writeSlot(t, tmp, rank, world, step, false)
		paths := snapshot.Paths(tmp, rank)
		s, err := snapshot.Newest(paths[:]...)
		require.NoError(t, err)
		require.NoError(t, os.Rename(s.Path, filepath.Join(stepDir, fmt.Sprintf("rank-%d.slot", rank))))
	}
}

func payloadOf(rank int, step uint64) []byte {
	return bytes.Repeat([]byte{byte(rank), byte(step)}, 5000)
}

// Before a round's fresh workers start, the agent (here of one node,
// over the static rendezvous) agrees on a step from what its directory
// holds and gives it to the workers: a replicated snapshot that another
// rank saved later is copied under each rank's name that lacks it, so
// that every rank restores the newest step any rank had; with nothing to
// restore, "none" and why. The embedded trainer's workers (InPlace) get
// nothing: they agree among themselves.
func TestPrepareSnapshots(t *testing.T) {
	for _, tc := range []struct {
		name    string
		slots   func(t *testing.T, dir string)
		inPlace bool
		durable func(t *testing.T, dst string) // nil: no durable directory
		env     []string
		holds   map[int]uint64 // rank -> the step its own slots must hold afterwards
		newest  uint64         // the newest step left in the directory (slots past the restored one discarded)
		empty   bool           // nothing left (nothing restored: every slot discarded)
	}{
		{name: "nothing yet", slots: func(*testing.T, string) {},
			env: []string{"GORUN_SNAPSHOT_STEP=none"}, empty: true}, // a new job: nothing said to the script
		{name: "replicated: the newest any rank had, copied", slots: func(t *testing.T, dir string) {
			writeSlot(t, dir, 0, 2, 4, true)
			writeSlot(t, dir, 0, 2, 5, true)
			writeSlot(t, dir, 1, 2, 4, true) // rank 1 died saving step 5
		}, env: []string{"GORUN_SNAPSHOT_STEP=5", "GORUN_SNAPSHOT_VERIFIED=1"}, holds: map[int]uint64{0: 5, 1: 5}, newest: 5},
		{name: "sharded: the newest every rank has", slots: func(t *testing.T, dir string) {
			writeSlot(t, dir, 0, 2, 4, false)
			writeSlot(t, dir, 0, 2, 5, false)
			writeSlot(t, dir, 1, 2, 3, false)
			writeSlot(t, dir, 1, 2, 4, false)
		}, env: []string{"GORUN_SNAPSHOT_STEP=4", "GORUN_SNAPSHOT_VERIFIED=1"}, holds: map[int]uint64{0: 4, 1: 4}, newest: 4},
		{name: "sharded at another world size", slots: func(t *testing.T, dir string) {
			writeSlot(t, dir, 0, 4, 7, false)
			writeSlot(t, dir, 1, 4, 7, false)
		}, env: []string{"GORUN_SNAPSHOT_STEP=none", "GORUN_SNAPSHOT_REASON=the world changed from 4 to 2 and the snapshots are sharded: restore at 4 ranks or from your checkpoint"}, empty: true},
		{name: "durable: the node's memory lost, loaded from the durable directory", slots: func(*testing.T, string) {},
			durable: func(t *testing.T, dst string) {
				writeDurable(t, dst, 2, 50, 0, 1)
				writeDurable(t, dst, 2, 100, 0, 1)
				writeDurable(t, dst, 2, 150, 0) // rank 1's copy of 150 never made it
			},
			env: []string{"GORUN_SNAPSHOT_STEP=100", "GORUN_SNAPSHOT_VERIFIED=1",
				"GORUN_SNAPSHOT_REASON=restoring step 100, ranks 0, 1 from the durable directory (newest step any rank had: 150; steps redone: 50)"},
			holds: map[int]uint64{0: 100, 1: 100}, newest: 100},
		{name: "durable: the same step in memory is taken from memory", slots: func(t *testing.T, dir string) {
			writeSlot(t, dir, 0, 2, 100, false)
			writeSlot(t, dir, 1, 2, 100, false)
		}, durable: func(t *testing.T, dst string) { writeDurable(t, dst, 2, 100, 0, 1) },
			env: []string{"GORUN_SNAPSHOT_STEP=100", "GORUN_SNAPSHOT_VERIFIED=1"}, holds: map[int]uint64{0: 100, 1: 100}, newest: 100},
		{name: "durable: a directory not made yet holds nothing", slots: func(*testing.T, string) {},
			durable: func(t *testing.T, dst string) { require.NoError(t, os.Remove(dst)) },
			env:     []string{"GORUN_SNAPSHOT_STEP=none"}, empty: true},
		{name: "in place: nothing", inPlace: true, slots: func(t *testing.T, dir string) { writeSlot(t, dir, 0, 2, 4, true) }, newest: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.slots(t, dir)
			r := rendezvous.Round{NumNodes: 1, WorldSize: 2}
			snaps := &Snapshots{Dir: dir, Node: "n0"}
			if tc.durable != nil {
				snaps.Durable = &Durable{Dir: t.TempDir(), Every: 50, Keep: 2}
				tc.durable(t, snaps.Durable.Dir)
			}
			a, err := New(Spec{LocalWorkers: 2, Command: []string{"true"}, ErrorDir: t.TempDir(), InPlace: tc.inPlace, Log: zerolog.Nop(),
				Snapshots: snaps}, &rendezvous.Static{Round: r})
			require.NoError(t, err)
			got, err := a.prepareSnapshots(context.Background(), r)
			require.NoError(t, err)
			require.Equal(t, tc.env, got.env)
			for rank, step := range tc.holds {
				var held *snapshot.Slot
				for _, p := range snapshot.Paths(dir, rank) {
					if s, err := snapshot.Verify(p); err == nil && s.Step == step {
						held = &s
					}
				}
				require.NotNil(t, held, "rank %d's slots do not hold step %d", rank, step)
				require.Equal(t, rank, held.Rank, "the copy is under rank %d's name", rank)
				p, err := snapshot.ReadPayload(*held)
				require.NoError(t, err)
				owner := rank
				if held.Replicated() {
					owner = 0 // the newest replicated step here is rank 0's
				}
				require.Equal(t, payloadOf(owner, step), p)
			}
			left, err := snapshot.Scan(dir)
			require.NoError(t, err)
			if tc.empty {
				require.Empty(t, left, "every slot of an abandoned timeline discarded")
			} else {
				require.NotEmpty(t, left)
				require.Equal(t, tc.newest, slices.MaxFunc(left, func(a, b snapshot.Holding) int { return cmp.Compare(a.Step, b.Step) }).Step,
					"the slots past the restored step discarded")
			}
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			for _, e := range entries {
				require.Regexp(t, `^rank-[01]\.slot[01]$`, e.Name())
			}
		})
	}
}

// The exchanged values are JSON lists of offers: each node's own, then,
// from node rank 0 alone, the durable directory's; anything else (a node
// of an older gorun sending one offer, a durable offer from another node
// or in the first place) is an error that says which node sent it.
func TestDecodeOffers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		nodes  []string // the offers' node ids, in order
		err    string
	}{
		{name: "nodes and the durable directory", values: []string{
			`[{"Node":"a","NodeRank":0},{"Node":"(durable)","NodeRank":2,"Durable":true}]`, `[{"Node":"b","NodeRank":1}]`},
			nodes: []string{"a", "(durable)", "b"}},
		{name: "no durable directory", values: []string{`[{"Node":"a"}]`, `[{"Node":"b","NodeRank":1}]`}, nodes: []string{"a", "b"}},
		{name: "one offer, not a list", values: []string{`{"Node":"a"}`}, err: "node rank 0's offer"},
		{name: "an empty list", values: []string{`[]`}, err: "not a JSON list of offers"},
		{name: "the durable directory from node rank 1", values: []string{`[{"Node":"a"}]`, `[{"Node":"b"},{"Node":"d","Durable":true}]`},
			err: "node rank 1's offer 1: only node rank 0 offers the durable directory"},
		{name: "the durable directory first", values: []string{`[{"Node":"d","Durable":true},{"Node":"a"}]`},
			err: "node rank 0's offer 0: only node rank 0 offers the durable directory, after its own"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			values := make([][]byte, len(tc.values))
			for i, v := range tc.values {
				values[i] = []byte(v)
			}
			got, err := decodeOffers(values)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			var nodes []string
			for _, o := range got {
				nodes = append(nodes, o.Node)
			}
			require.Equal(t, tc.nodes, nodes)
		})
	}
}
