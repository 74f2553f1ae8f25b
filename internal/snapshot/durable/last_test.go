package durable

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/snapshot"
)

// PersistLast, at the end of an agent's life, copies both slots of each of
// its ranks whatever their step, so that ranks stopped a step apart still
// share one in dst, and prunes as Persist does.
func TestPersistLast(t *testing.T) {
	type saved struct {
		rank int
		step uint64
	}
	tests := []struct {
		name   string
		flags  uint32
		before []saved // persisted to dst first, by Persist (every step)
		slots  []saved // then in the slots, in this order (a rank's last two stay)
		damage string  // a slot file whose payload is flipped before PersistLast
		want   map[string][]string
		kept   []saved // what PersistLast returns, newest step first
	}{
		{
			name:  "ranks a step apart: both slots of each, the common step complete",
			slots: []saved{{0, 6}, {0, 7}, {1, 5}, {1, 6}},
			want: map[string][]string{stepDir(5): {"rank-1.slot"}, stepDir(6): {"rank-0.slot", "rank-1.slot"},
				stepDir(7): {"rank-0.slot"}},
			kept: []saved{{0, 7}, {0, 6}, {1, 6}, {1, 5}},
		},
		{
			name:   "the older complete steps pruned, keeping 2",
			before: []saved{{0, 2}, {1, 2}, {0, 4}, {1, 4}},
			slots:  []saved{{0, 5}, {0, 6}, {1, 5}, {1, 6}},
			want: map[string][]string{stepDir(5): {"rank-0.slot", "rank-1.slot"},
				stepDir(6): {"rank-0.slot", "rank-1.slot"}},
			kept: []saved{{0, 6}, {1, 6}, {0, 5}, {1, 5}},
		},
		{
			name:   "a step persisted before is not copied again, and is returned",
			before: []saved{{0, 6}, {1, 6}},
			slots:  []saved{{0, 6}, {1, 6}},
			want:   map[string][]string{stepDir(6): {"rank-0.slot", "rank-1.slot"}},
			kept:   []saved{{0, 6}, {1, 6}},
		},
		{
			name:  "a replicated state: rank 0's slots alone",
			flags: snapshot.FlagReplicated,
			slots: []saved{{0, 3}, {0, 4}, {1, 3}, {1, 4}},
			want:  map[string][]string{stepDir(3): {"rank-0.slot"}, stepDir(4): {"rank-0.slot"}},
			kept:  []saved{{0, 4}, {0, 3}},
		},
		{
			name:   "a corrupt slot: said, the others persisted",
			slots:  []saved{{0, 6}, {0, 7}, {1, 6}, {1, 7}},
			damage: "rank-1.slot1",
			want:   map[string][]string{stepDir(6): {"rank-0.slot", "rank-1.slot"}, stepDir(7): {"rank-0.slot"}},
			kept:   []saved{{0, 7}, {0, 6}, {1, 6}},
		},
		{
			name: "nothing saved: nothing to do",
			want: map[string][]string{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "durable")
			if len(tt.before) > 0 {
				n := newNode(t, dst, []int{0, 1}, 2, 1, 10)
				n.start(t, nil)
				for _, s := range tt.before {
					n.save(t, s.rank, s.step, 5000)
					n.persisted(t, s.step, s.rank)
				}
				require.NoError(t, n.stop())
			}
			n := newNode(t, dst, []int{0, 1}, 2, 1, 2)
			n.flags = tt.flags
			for _, s := range tt.slots {
				n.save(t, s.rank, s.step, 5000)
			}
			if tt.damage != "" {
				flipPayload(t, filepath.Join(n.src, tt.damage))
			}
			got, err := PersistLast(context.Background(), n.src, []int{0, 1}, dst, 2, zerolog.New(zerolog.NewTestWriter(t)))
			if tt.damage != "" {
				require.ErrorContains(t, err, filepath.Join(n.src, tt.damage)+" (step 7)")
				require.ErrorIs(t, err, errOverwritten, "a payload that disagrees with its header")
			} else {
				require.NoError(t, err)
			}
			var kept []saved
			for _, h := range got {
				kept = append(kept, saved{h.Rank, h.Step})
			}
			require.Equal(t, tt.kept, kept)
			require.Equal(t, tt.want, tree(t, dst))
			hs, err := Scan(dst)
			require.NoError(t, err)
			require.Len(t, hs, len(filesIn(tt.want)), "every file whole")
		})
	}
}

func TestPersistLastRefusesBadArguments(t *testing.T) {
	_, err := PersistLast(context.Background(), t.TempDir(), []int{0}, t.TempDir(), 0, zerolog.Nop())
	require.ErrorContains(t, err, "keep 0")
	_, err = PersistLast(context.Background(), t.TempDir(), nil, t.TempDir(), 1, zerolog.Nop())
	require.ErrorContains(t, err, "no ranks")
}

// flipPayload flips a payload byte of the slot file at path.
func flipPayload(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	b := []byte{0}
	_, err = f.ReadAt(b, snapshot.HeaderSize+10)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{b[0] ^ 0x80}, snapshot.HeaderSize+10)
	require.NoError(t, err)
}

func filesIn(tree map[string][]string) []string {
	var out []string
	for dir, names := range tree {
		for _, n := range names {
			out = append(out, filepath.Join(dir, n))
		}
	}
	return out
}
