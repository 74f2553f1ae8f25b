package durable

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gorun/gorun/internal/snapshot"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runRole(role))
	}
	goleak.VerifyTestMain(m)
}

// event is a point a copy of rank's step reached.
type event struct {
	at   point
	rank int
	step uint64
}

// node is one agent's Persist under test: its snapshot directory, its
// ranks' slots (the test plays the workers), and the outcome of each copy.
type node struct {
	src      string
	world    int
	flags    uint32
	slots    map[int]*snapshot.RankSlots
	p        *persister
	outcomes chan event   // atPersisted, atDropped, atFailed
	cancel   func()       // ends Persist's context
	wait     func() error // waits for Persist to return
}

// stop ends Persist and returns its error.
func (n *node) stop() error {
	n.cancel()
	return n.wait()
}

// newNode makes a node persisting ranks of a world to dst, copying in
// chunks of 4 KiB so that small payloads take several.
func newNode(t *testing.T, dst string, ranks []int, world, every, keep int) *node {
	t.Helper()
	n := &node{src: t.TempDir(), world: world, slots: map[int]*snapshot.RankSlots{}, outcomes: make(chan event, 64)}
	p, err := newPersister(n.src, ranks, dst, every, keep, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	p.chunk = 4096
	n.p = p
	for _, r := range ranks {
		s, err := snapshot.OpenRank(n.src, r)
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		n.slots[r] = s
	}
	return n
}

// start runs Persist; hook, when not nil, runs at every point first.
func (n *node) start(t *testing.T, hook func(event)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	n.p.hook = func(at point, rank int, step uint64) {
		e := event{at, rank, step}
		if hook != nil {
			hook(e)
		}
		switch at {
		case atPersisted, atDropped, atFailed:
			n.outcomes <- e
		}
	}
	done := make(chan error, 1)
	go func() { done <- n.p.run(ctx) }()
	var once sync.Once
	var err error
	n.cancel = cancel
	n.wait = func() error {
		once.Do(func() { err = <-done })
		return err
	}
	t.Cleanup(func() { n.stop() })
}

// payload returns size bytes that differ with rank and step, chunk by chunk.
func payload(rank int, step uint64, size int) []byte {
	b := make([]byte, size)
	x := uint32(rank)*2654435761 + uint32(step)*40503 + 1
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

// save writes rank's snapshot of step, as its worker would, and returns
// its payload.
func (n *node) save(t *testing.T, rank int, step uint64, size int) []byte {
	t.Helper()
	b := payload(rank, step, size)
	h := snapshot.Header{Step: step, Length: uint64(len(b)), Flags: n.flags, World: n.world}
	require.NoError(t, n.slots[rank].Write(h, bytes.NewReader(b)))
	return b
}

// next returns the outcome of the next copy; a minute without one fails
// the test (a copy of a few KiB that never ends is a hang).
func (n *node) next(t *testing.T) event {
	t.Helper()
	select {
	case e := <-n.outcomes:
		return e
	case <-time.After(time.Minute):
		t.Fatal("no copy ended within a minute")
		return event{}
	}
}

// persisted returns the outcomes of the next len(ranks) copies, which must
// be the persisting of step for each of ranks.
func (n *node) persisted(t *testing.T, step uint64, ranks ...int) {
	t.Helper()
	var want, got []event
	for _, r := range ranks {
		want = append(want, event{atPersisted, r, step})
		got = append(got, n.next(t))
	}
	sort.Slice(got, func(i, j int) bool { return got[i].rank < got[j].rank })
	require.Equal(t, want, got)
}

// tree lists dst: each step directory with the names in it.
func tree(t *testing.T, dst string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	dirs, err := os.ReadDir(dst)
	require.NoError(t, err)
	for _, d := range dirs {
		files, err := os.ReadDir(filepath.Join(dst, d.Name()))
		require.NoError(t, err)
		names := []string{}
		for _, f := range files {
			names = append(names, f.Name())
		}
		out[d.Name()] = names
	}
	return out
}

func TestPersistEveryNthStepAtomicallyAndVerified(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "durable") // Persist makes it
	n := newNode(t, dst, []int{0, 1}, 2, 3, 10)
	n.start(t, nil)
	saved := map[uint64]map[int][]byte{}
	for step := uint64(1); step <= 9; step++ {
		saved[step] = map[int][]byte{}
		for _, r := range []int{0, 1} {
			saved[step][r] = n.save(t, r, step, 10000+int(step))
		}
		if step%3 == 0 {
			n.persisted(t, step, 0, 1)
		}
	}
	require.NoError(t, n.stop())
	both := []string{"rank-0.slot", "rank-1.slot"}
	require.Equal(t, map[string][]string{"step-000000000003": both, "step-000000000006": both, "step-000000000009": both},
		tree(t, dst), "every third step, each rank under its final name, no temporary file left")
	for _, step := range []uint64{3, 6, 9} {
		dir := filepath.Join(dst, stepDir(step))
		info, err := os.Stat(dir)
		require.NoError(t, err)
		require.Equal(t, fs.ModeDir|0o700, info.Mode())
		for _, r := range []int{0, 1} {
			s, err := snapshot.Verify(filepath.Join(dir, slotName(r)))
			require.NoError(t, err)
			require.Equal(t, snapshot.Header{Step: step, Length: uint64(len(saved[step][r])), CRC: s.CRC, Rank: r, World: 2}, s.Header)
			b, err := snapshot.ReadPayload(s)
			require.NoError(t, err)
			require.Equal(t, saved[step][r], b, "rank %d step %d", r, step)
			info, err := os.Stat(s.Path)
			require.NoError(t, err)
			require.Equal(t, fs.FileMode(0o600), info.Mode())
		}
	}
}

// A copy of a slot that the worker began to overwrite is dropped, and the
// next due step is persisted.
func TestPersistDropsACopyTheWorkerOverwrote(t *testing.T) {
	dst := t.TempDir()
	n := newNode(t, dst, []int{0}, 1, 2, 10)
	n.save(t, 0, 1, 50000)
	n.save(t, 0, 2, 50000)
	copying, resume := make(chan struct{}), make(chan struct{})
	n.start(t, func(e event) {
		if e == (event{atCopying, 0, 2}) {
			copying <- struct{}{}
			<-resume
		}
	})
	<-copying
	n.save(t, 0, 3, 50000)
	n.save(t, 0, 4, 50000) // into step 2's slot
	close(resume)
	require.Equal(t, event{atDropped, 0, 2}, n.next(t))
	require.Equal(t, event{atPersisted, 0, 4}, n.next(t))
	require.NoError(t, n.stop())
	require.Equal(t, map[string][]string{"step-000000000002": {}, "step-000000000004": {"rank-0.slot"}}, tree(t, dst))
	_, err := snapshot.Verify(filepath.Join(dst, stepDir(4), slotName(0)))
	require.NoError(t, err)
}

// A copy that storage does not give back as written (a byte flipped in the
// temporary file after it was written, as a faulty disk or server would)
// fails its read-back and never gets its final name.
func TestPersistVerifiesWhatItWrote(t *testing.T) {
	dst := t.TempDir()
	n := newNode(t, dst, []int{0}, 1, 2, 10)
	n.save(t, 0, 1, 50000)
	n.save(t, 0, 2, 50000)
	damaged := make(chan error, 1)
	n.start(t, func(e event) {
		if e == (event{atCopying, 0, 2}) {
			damaged <- flipTmp(filepath.Join(dst, stepDir(2)))
		}
	})
	require.Equal(t, event{atFailed, 0, 2}, n.next(t))
	require.NoError(t, <-damaged)
	n.save(t, 0, 3, 50000)
	n.save(t, 0, 4, 50000)
	require.Equal(t, event{atPersisted, 0, 4}, n.next(t))
	require.NoError(t, n.stop())
	require.Equal(t, map[string][]string{"step-000000000002": {}, "step-000000000004": {"rank-0.slot"}}, tree(t, dst))
}

// flipTmp flips a payload byte of the one temporary copy in dir.
func flipTmp(dir string) error {
	tmps, err := filepath.Glob(filepath.Join(dir, ".rank-*.slot.tmp-*"))
	if err != nil || len(tmps) != 1 {
		return fmt.Errorf("temporary copies %v: %v", tmps, err)
	}
	f, err := os.OpenFile(tmps[0], os.O_RDWR, 0)
	if err != nil {
		return err
	}
	b := []byte{0}
	if _, err := f.ReadAt(b, snapshot.HeaderSize+10); err != nil {
		return errors.Join(err, f.Close())
	}
	_, err = f.WriteAt([]byte{b[0] ^ 0x80}, snapshot.HeaderSize+10)
	return errors.Join(err, f.Close())
}

func TestPersistKeepsTheNewestCompleteSteps(t *testing.T) {
	t.Run("one node keeps 2", func(t *testing.T) {
		dst := t.TempDir()
		n := newNode(t, dst, []int{0}, 1, 1, 2)
		n.start(t, nil)
		for step := uint64(1); step <= 5; step++ {
			n.save(t, 0, step, 100)
			n.persisted(t, step, 0)
			want := map[string][]string{stepDir(step): {"rank-0.slot"}}
			if step > 1 {
				want[stepDir(step-1)] = []string{"rank-0.slot"}
			}
			require.Equal(t, want, tree(t, dst), "after step %d", step)
		}
	})
	// Two nodes share dst, each deleting only its own ranks' files; a step
	// one node has written and the other not yet is incomplete and does not
	// count, so the newest complete one stays.
	t.Run("two nodes keep 1", func(t *testing.T) {
		dst := t.TempDir()
		a := newNode(t, dst, []int{0}, 2, 1, 1)
		b := newNode(t, dst, []int{1}, 2, 1, 1)
		a.start(t, nil)
		b.start(t, nil)
		r0 := []string{"rank-0.slot"}
		both := []string{"rank-0.slot", "rank-1.slot"}
		steps := []struct {
			node *node
			rank int
			step uint64
			want map[string][]string
		}{
			{a, 0, 1, map[string][]string{"step-000000000001": r0}},
			{b, 1, 1, map[string][]string{"step-000000000001": both}},
			{a, 0, 2, map[string][]string{"step-000000000001": both, "step-000000000002": r0}},
			{b, 1, 2, map[string][]string{"step-000000000001": r0, "step-000000000002": both}},
			{a, 0, 3, map[string][]string{"step-000000000002": both, "step-000000000003": r0}},
		}
		for _, s := range steps {
			s.node.save(t, s.rank, s.step, 100)
			s.node.persisted(t, s.step, s.rank)
			require.Equal(t, s.want, tree(t, dst), "after rank %d step %d", s.rank, s.step)
		}
	})
	// A replicated state (DDP: local rank 0 of each node saves, here ranks
	// 0 and 2 of a world of 4): rank 0's file alone is persisted, and one
	// replicated file makes a step complete, so the older steps go.
	t.Run("a replicated state of two nodes keeps 2", func(t *testing.T) {
		dst := t.TempDir()
		a := newNode(t, dst, []int{0}, 4, 1, 2)
		b := newNode(t, dst, []int{2}, 4, 1, 2)
		a.flags, b.flags = snapshot.FlagReplicated, snapshot.FlagReplicated
		skipped := make(chan uint64, 8)
		a.start(t, nil)
		b.start(t, func(e event) {
			if e.at == atSkipped {
				skipped <- e.step
			}
		})
		for step := uint64(1); step <= 4; step++ {
			b.save(t, 2, step, 100)
			a.save(t, 0, step, 100)
			a.persisted(t, step, 0)
			want := map[string][]string{stepDir(step): {"rank-0.slot"}}
			if step > 1 {
				want[stepDir(step-1)] = []string{"rank-0.slot"}
			}
			require.Equal(t, want, tree(t, dst), "after step %d", step)
		}
		for step := <-skipped; step < 4; step = <-skipped { // Watch may report only the newer of two
		}
		require.Empty(t, b.outcomes, "rank 2 holds rank 0's state: nothing of it is copied")
		require.Equal(t, map[string][]string{stepDir(3): {"rank-0.slot"}, stepDir(4): {"rank-0.slot"}}, tree(t, dst))
	})
}

// persistTree persists steps 2 and 4 of ranks 0 and 1 (world 2; rank 0's
// alone when flags say the state is replicated) to a new durable directory
// and returns it and the payloads of both ranks.
func persistTree(t *testing.T, flags uint32) (string, map[uint64]map[int][]byte) {
	t.Helper()
	dst := t.TempDir()
	n := newNode(t, dst, []int{0, 1}, 2, 2, 10)
	n.flags = flags
	persisting := []int{0, 1}
	if flags&snapshot.FlagReplicated != 0 {
		persisting = []int{0} // rank 1 holds the same state
	}
	n.start(t, nil)
	saved := map[uint64]map[int][]byte{}
	for step := uint64(1); step <= 4; step++ {
		saved[step] = map[int][]byte{}
		for _, r := range []int{0, 1} {
			saved[step][r] = n.save(t, r, step, 9000)
		}
		if step%2 == 0 {
			n.persisted(t, step, persisting...)
		}
	}
	require.NoError(t, n.stop())
	return dst, saved
}

// TestScanSkipsIncompleteFiles: Scan offers what is complete by its header
// and length, without reading payloads; a flipped payload byte is Load's to
// find (TestLoadRoundTrips).
func TestScanSkipsIncompleteFiles(t *testing.T) {
	holding := func(r int, step uint64) snapshot.Holding {
		return snapshot.Holding{Rank: r, World: 2, Step: step}
	}
	all := []snapshot.Holding{holding(0, 2), holding(0, 4), holding(1, 2), holding(1, 4)}
	r1s4 := func(dst string) string { return filepath.Join(dst, stepDir(4), slotName(1)) }
	flip := func(off int64) func(t *testing.T, dst string) {
		return func(t *testing.T, dst string) {
			f, err := os.OpenFile(r1s4(dst), os.O_RDWR, 0)
			require.NoError(t, err)
			defer f.Close()
			b := []byte{0}
			_, err = f.ReadAt(b, off)
			require.NoError(t, err)
			_, err = f.WriteAt([]byte{b[0] ^ 0x01}, off)
			require.NoError(t, err)
		}
	}
	tests := []struct {
		name   string
		damage func(t *testing.T, dst string)
		want   []snapshot.Holding
	}{
		{"whole", func(*testing.T, string) {}, all},
		{"a payload byte flipped: offered, Load checks the payload", flip(snapshot.HeaderSize + 5000), all},
		{"a header byte flipped", flip(20), []snapshot.Holding{all[0], all[1], all[2]}},
		{"cut short", func(t *testing.T, dst string) { require.NoError(t, os.Truncate(r1s4(dst), snapshot.HeaderSize+10)) },
			[]snapshot.Holding{all[0], all[1], all[2]}},
		{"a file under another rank's name", func(t *testing.T, dst string) {
			require.NoError(t, os.Rename(r1s4(dst), filepath.Join(dst, stepDir(4), slotName(3))))
		}, []snapshot.Holding{all[0], all[1], all[2]}},
		{"a file in another step's directory", func(t *testing.T, dst string) {
			require.NoError(t, os.Rename(filepath.Join(dst, stepDir(4)), filepath.Join(dst, stepDir(6))))
		}, []snapshot.Holding{all[0], all[2]}},
		{"temporary copies and other names ignored", func(t *testing.T, dst string) {
			dir := filepath.Join(dst, stepDir(4))
			require.NoError(t, os.WriteFile(filepath.Join(dir, ".rank-1.slot.tmp-123"), nil, 0o600))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "rank-01.slot"), nil, 0o600))
			require.NoError(t, os.Mkdir(filepath.Join(dst, "step-4"), 0o700))
			require.NoError(t, os.WriteFile(filepath.Join(dst, "notes"), nil, 0o600))
		}, all},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst, _ := persistTree(t, 0)
			tt.damage(t, dst)
			got, err := Scan(dst)
			require.NoError(t, err)
			for i := range got {
				require.Equal(t, filepath.Join(dst, stepDir(got[i].Step), slotName(got[i].Rank)), got[i].Path)
				got[i].Path = ""
			}
			require.Equal(t, tt.want, got)
		})
	}
	_, err := Scan(filepath.Join(t.TempDir(), "none"))
	require.ErrorIs(t, err, fs.ErrNotExist)
}

func TestLoadRoundTrips(t *testing.T) {
	tests := []struct {
		name    string
		flags   uint32
		into    func(h snapshot.Holding) int // the rank whose slots receive h
		damage  func(t *testing.T, h snapshot.Holding)
		wantErr error  // nil: loaded
		errText string // with wantErr nil: an error saying this
	}{
		{"into its own rank", 0, func(h snapshot.Holding) int { return h.Rank }, nil, nil, ""},
		{"replicated, into another rank", snapshot.FlagReplicated, func(h snapshot.Holding) int { return 1 - h.Rank }, nil, nil, ""},
		{"corrupt since the scan", 0, func(h snapshot.Holding) int { return h.Rank }, func(t *testing.T, h snapshot.Holding) {
			f, err := os.OpenFile(h.Path, os.O_RDWR, 0)
			require.NoError(t, err)
			_, err = f.WriteAt([]byte("x"), snapshot.HeaderSize+100)
			require.NoError(t, errors.Join(err, f.Close()))
		}, snapshot.ErrCorrupt, ""},
		{"replaced since the scan", 0, func(h snapshot.Holding) int { return h.Rank }, func(t *testing.T, h snapshot.Holding) {
			other := filepath.Join(filepath.Dir(filepath.Dir(h.Path)), stepDir(4), slotName(h.Rank))
			require.NoError(t, os.Rename(other, h.Path))
		}, nil, "scan again"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst, saved := persistTree(t, tt.flags)
			hs, err := Scan(dst)
			require.NoError(t, err)
			if tt.flags&snapshot.FlagReplicated != 0 {
				require.Len(t, hs, 2, "rank 0's steps 2 and 4")
			} else {
				require.Len(t, hs, 4)
			}
			for _, h := range hs {
				if h.Step != 2 {
					continue
				}
				if tt.damage != nil {
					tt.damage(t, h)
				}
				local := t.TempDir()
				rank := tt.into(h)
				slots, err := snapshot.OpenRank(local, rank)
				require.NoError(t, err)
				err = Load(h, slots)
				require.NoError(t, slots.Close())
				paths := snapshot.Paths(local, rank)
				got, newestErr := snapshot.Newest(paths[:]...)
				switch {
				case tt.wantErr != nil || tt.errText != "":
					if tt.wantErr != nil {
						require.ErrorIs(t, err, tt.wantErr)
						if errors.Is(tt.wantErr, snapshot.ErrCorrupt) {
							// Put aside: no later scan offers it.
							require.NoFileExists(t, h.Path)
							require.FileExists(t, h.Path+corruptSuffix)
							again, err := Scan(dst)
							require.NoError(t, err)
							require.NotContains(t, again, h)
						}
					} else {
						require.ErrorContains(t, err, tt.errText)
					}
					require.ErrorIs(t, newestErr, snapshot.ErrNone, "nothing complete is left behind")
					continue
				}
				require.NoError(t, err)
				require.NoError(t, newestErr)
				require.Equal(t, snapshot.Header{Step: 2, Length: 9000, CRC: got.CRC, Flags: tt.flags, Rank: rank, World: 2}, got.Header)
				b, err := snapshot.ReadPayload(got)
				require.NoError(t, err)
				require.Equal(t, saved[2][h.Rank], b)
			}
		})
	}
}

func TestFind(t *testing.T) {
	dst, _ := persistTree(t, snapshot.FlagReplicated)
	hs, err := Scan(dst)
	require.NoError(t, err)
	for _, h := range hs {
		got, err := Find(dst, h.Rank, h.Step)
		require.NoError(t, err)
		require.Equal(t, h, got, "Find agrees with Scan")
	}
	require.NoError(t, os.Rename(filepath.Join(dst, stepDir(4), slotName(0)), filepath.Join(dst, stepDir(4), slotName(1))))
	tests := []struct {
		name string
		rank int
		step uint64
		is   error
		text string
	}{
		{"no such step", 0, 6, fs.ErrNotExist, "step-000000000006/rank-0.slot"},
		{"no such rank", 0, 4, fs.ErrNotExist, "step-000000000004/rank-0.slot"},
		{"another rank's file under this name", 1, 4, nil, "holds rank 0 at step 4, not rank 1 at step 4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Find(dst, tt.rank, tt.step)
			if tt.is != nil {
				require.ErrorIs(t, err, tt.is)
			}
			require.ErrorContains(t, err, tt.text)
		})
	}
}

// Cancelling Persist's context ends a copy between two chunks: the
// temporary file is removed and nothing is persisted.
func TestPersistEndsWithItsContext(t *testing.T) {
	t.Run("while it waits", func(t *testing.T) {
		dst := t.TempDir()
		n := newNode(t, dst, []int{0, 1}, 2, 1, 1)
		n.start(t, nil)
		require.NoError(t, n.stop())
	})
	for _, at := range []point{atCopying, atSynced} {
		t.Run(fmt.Sprintf("in the middle of a copy (point %d)", at), func(t *testing.T) {
			dst := t.TempDir()
			n := newNode(t, dst, []int{0}, 1, 1, 1)
			n.save(t, 0, 1, 1000*4096)
			reached, resume := make(chan struct{}), make(chan struct{})
			n.start(t, func(e event) {
				if e.at == at {
					reached <- struct{}{}
					<-resume
				}
			})
			<-reached
			n.cancel()
			close(resume)
			require.NoError(t, n.wait())
			require.Equal(t, map[string][]string{"step-000000000001": {}}, tree(t, dst))
			require.Empty(t, n.outcomes)
		})
	}
}

func TestPersistRefusesBadArguments(t *testing.T) {
	tests := []struct {
		name        string
		src, dst    string
		ranks       []int
		every, keep int
		want        string
	}{
		{"no source", "", "d", []int{0}, 1, 1, "no snapshot directory"},
		{"no destination", "s", "", []int{0}, 1, 1, "--snapshot-durable"},
		{"every 0", "s", "d", []int{0}, 0, 1, "every 0: persist every Nth snapshot with N >= 1 (--snapshot-durable-every)"},
		{"keep 0", "s", "d", []int{0}, 1, 0, "keep 0: keep the newest M steps with M >= 1 (--snapshot-durable-keep)"},
		{"no ranks", "s", "d", nil, 1, 1, "no ranks"},
		{"a rank twice", "s", "d", []int{1, 1}, 1, 1, "ranks [1 1]: each global rank once"},
		{"a negative rank", "s", "d", []int{-1}, 1, 1, "none negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Persist(context.Background(), tt.src, tt.ranks, tt.dst, tt.every, tt.keep, zerolog.Nop())
			require.ErrorContains(t, err, tt.want)
		})
	}
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	err := Persist(context.Background(), t.TempDir(), []int{0}, filepath.Join(file, "durable"), 1, 1, zerolog.Nop())
	require.ErrorContains(t, err, "cannot make the durable directory")
}
