package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) != "" {
		os.Exit(runRank())
	}
	goleak.VerifyTestMain(m)
}

func TestShardRange(t *testing.T) {
	tests := []struct {
		n             int64
		shard, shards int
		lo, hi        int64
	}{
		{10, 0, 1, 0, 10},
		{10, 0, 2, 0, 5},
		{10, 1, 2, 5, 10},
		{10, 0, 3, 0, 4},
		{10, 1, 3, 4, 8},
		{10, 2, 3, 8, 10},
		{10, 3, 4, 9, 10},
		{2, 2, 4, 2, 2}, // padding only
		{2, 3, 4, 2, 2},
		{0, 0, 2, 0, 0},
		{10, 2, 2, 0, 0}, // out of range
		{10, -1, 2, 0, 0},
		{10, 0, 0, 0, 0},
	}
	for _, tc := range tests {
		lo, hi := ShardRange(tc.n, tc.shard, tc.shards)
		require.Equal(t, [2]int64{tc.lo, tc.hi}, [2]int64{lo, hi}, "n=%d shard %d of %d", tc.n, tc.shard, tc.shards)
	}
	// Every layout tiles every length exactly once.
	for n := int64(0); n < 40; n++ {
		for s := 1; s <= 6; s++ {
			next := int64(0)
			for i := range s {
				lo, hi := ShardRange(n, i, s)
				require.Equal(t, next, lo)
				next = hi
			}
			require.Equal(t, n, next)
		}
	}
}

func TestStepNames(t *testing.T) {
	require.Equal(t, "step-00001200", StepName(1200))
	require.Equal(t, "step-123456789", StepName(123456789))
	for name, want := range map[string]int64{"step-00001200": 1200, "step-123456789": 123456789} {
		got, ok := ParseStep(name)
		require.True(t, ok, name)
		require.Equal(t, want, got)
	}
	for _, name := range []string{"step-12", "step-0000120x", "step--0000001", ".tmp-step-00000001-ab", "foo"} {
		_, ok := ParseStep(name)
		require.False(t, ok, name)
	}
}

// TestReshardRoundTrips saves at 2x2 (hsdp: replicas hold the same shard, written once) and
// loads at other layouts, checking the data bit for bit, the bytes each rank read, and that a
// re-save at the new layout diffs to zero against the original and verifies.
func TestReshardRoundTrips(t *testing.T) {
	specs := testSpecs()
	state := makeState(specs, 100)
	root := t.TempDir()
	src := filepath.Join(root, "src")
	saveWorld(t, src, World{Replicas: 2, Shards: 2, Mode: "hsdp"}, 100, specs, state, nil)

	m, err := ReadManifest(filepath.Join(src, StepName(100)))
	require.NoError(t, err)
	var total int64
	for _, s := range specs {
		total += numel(s.shape) * elemBytes
	}
	var written int64
	for _, f := range m.Files {
		written += f.Bytes
		require.InDelta(t, total/4, f.Bytes, float64(len(specs)*elemBytes), "%s writes a quarter", f.Name)
	}
	require.Equal(t, total, written, "replicated shards are written once")
	require.Len(t, m.Files, 4)
	require.Equal(t, []byte{100, 1, 2}, m.RNG)
	require.Equal(t, int64(3200), m.SampleIndex)

	for _, w := range []World{{1, 1, "ddp"}, {1, 3, "fsdp"}, {3, 1, "ddp"}, {4, 1, "ddp"}, {2, 2, "hsdp"}, {2, 3, "hsdp"}} {
		t.Run(w.String(), func(t *testing.T) {
			loaded, reqs, errs := loadWorld(w, src, specs)
			for r := range errs {
				require.NoError(t, errs[r], "rank %d", r)
				require.Empty(t, loaded[r].Skipped)
				require.Equal(t, int64(100), loaded[r].Manifest.Step)
				requireHolds(t, state, reqs[r])
				// A rank reads what it asked for plus at most one partial block at each end of
				// each chunk it overlaps; never whole chunks.
				var want int64
				for _, q := range reqs[r] {
					want += int64(len(q.Dst)) * elemBytes
				}
				require.LessOrEqual(t, loaded[r].BytesRead, want+int64(len(m.Files))*int64(len(specs))*2*4096, "rank %d read too much", r)
			}
			// Re-save from what each rank loaded, at the new layout.
			dst := filepath.Join(root, "resaved-"+strings.ReplaceAll(w.String(), " ", "-"))
			errs = onRanks(w, func(ctx context.Context, c Coordinator) error {
				s, err := NewSaver(Config{Dir: dst, World: w, Coord: c, BlockBytes: 4096})
				if err != nil {
					return err
				}
				var ts []Tensor
				for i, q := range reqs[c.Rank()] {
					ts = append(ts, Tensor{Name: q.Name, Shape: specs[i].shape, Offset: q.Offset, Data: q.Dst})
				}
				return s.Save(ctx, Meta{Step: 100}, ts)
			})
			for r, err := range errs {
				require.NoError(t, err, "rank %d", r)
			}
			a, err := Open(filepath.Join(src, StepName(100)))
			require.NoError(t, err)
			defer a.Close()
			b, err := Open(filepath.Join(dst, StepName(100)))
			require.NoError(t, err)
			defer b.Close()
			require.NoError(t, b.Verify(context.Background()))
			rep, err := Compare(context.Background(), a, b, Tolerance{})
			require.NoError(t, err)
			require.Len(t, rep.Tensors, len(specs))
			for _, d := range rep.Tensors {
				require.True(t, d.Close, "%s: %+v", d.Name, d)
				require.Zero(t, d.MaxAbs)
			}
		})
	}
}

func TestDefaultBlockSizeReadsOnlyOverlap(t *testing.T) {
	// 3 MiB + 3 floats saved by one rank, read back a few elements from the middle.
	specs := []spec{{"w", []int64{3<<18 + 3}}}
	state := makeState(specs, 1)
	dir := t.TempDir()
	saveWorld(t, dir, World{Replicas: 1, Shards: 1}, 1, specs, state, func(c *Config) { c.BlockBytes = 0 })
	req := []Request{{Name: "w", Offset: 1<<18 + 5, Dst: make([]float32, 10)}}
	l, err := Load(context.Background(), nil, dir, req)
	require.NoError(t, err)
	requireHolds(t, state, req)
	require.Equal(t, int64(DefaultBlockBytes), l.BytesRead, "one checksum block, not the 12 MiB chunk")
	require.Equal(t, int64(DefaultBlockBytes), l.Manifest.BlockBytes)
}

func TestFlippedByteFailsVerifyAndLoadFallsBack(t *testing.T) {
	specs := testSpecs()
	dir := t.TempDir()
	w := World{Replicas: 2, Shards: 2, Mode: "hsdp"}
	s100, s200 := makeState(specs, 100), makeState(specs, 200)
	saveWorld(t, dir, w, 100, specs, s100, nil)
	saveWorld(t, dir, w, 200, specs, s200, nil)

	m, err := ReadManifest(filepath.Join(dir, StepName(200)))
	require.NoError(t, err)
	// Flip a byte in the middle of rank 1's chunk of wte.
	var victim Chunk
	for _, tm := range m.Tensors {
		for _, c := range tm.Chunks {
			if tm.Name == "wte" && c.File == "shard-00001.bin" {
				victim = c
			}
		}
	}
	require.NotEmpty(t, victim.File)
	path := filepath.Join(dir, StepName(200), victim.File)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	at := victim.ByteOffset + victim.Length*elemBytes/2
	b := []byte{0}
	_, err = f.ReadAt(b, at)
	require.NoError(t, err)
	b[0] ^= 0x10
	_, err = f.WriteAt(b, at)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	ck, err := Open(filepath.Join(dir, StepName(200)))
	require.NoError(t, err, "sizes and manifest are intact")
	verr := ck.Verify(context.Background())
	require.NoError(t, ck.Close())
	var ce *CorruptError
	require.ErrorAs(t, verr, &ce)
	require.Equal(t, "shard-00001.bin", ce.File)
	require.Equal(t, "wte", ce.Tensor)
	require.Contains(t, verr.Error(), "shard-00001.bin tensor wte: crc32c mismatch")

	// Every layout falls back together, even the ranks that never read the bad block.
	for _, lw := range []World{w, {1, 1, ""}, {1, 3, ""}} {
		loaded, reqs, errs := loadWorld(lw, dir, specs)
		for r := range errs {
			require.NoError(t, errs[r])
			require.Equal(t, int64(100), loaded[r].Manifest.Step)
			require.Len(t, loaded[r].Skipped, 1)
			require.Contains(t, loaded[r].Skipped[0].Reason, "shard-00001.bin tensor wte: crc32c mismatch")
			require.Contains(t, loaded[r].Summary(), "checkpoint step-00000200 is corrupt (")
			require.True(t, strings.HasSuffix(loaded[r].Summary(), "loading step-00000100"), loaded[r].Summary())
			requireHolds(t, s100, reqs[r])
		}
	}
}

func TestLoadErrors(t *testing.T) {
	specs := testSpecs()
	dir := t.TempDir()
	saveWorld(t, dir, World{Replicas: 1, Shards: 2}, 5, specs, makeState(specs, 5), nil)
	tests := []struct {
		name string
		dir  string
		req  Request
		is   error
		want string
	}{
		{"no directory", filepath.Join(dir, "nope"), Request{Name: "wte"}, ErrNoCheckpoint, "no complete checkpoint"},
		{"unknown tensor", dir, Request{Name: "nope", Dst: make([]float32, 1)}, nil, "tensor nope: not in the checkpoint"},
		{"past the end", dir, Request{Name: "bias", Offset: 5, Dst: make([]float32, 3)}, nil, "range [5, 8) outside its 7 elements"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Load(context.Background(), nil, tc.dir, []Request{tc.req})
			require.Error(t, err)
			require.Nil(t, l)
			require.Contains(t, err.Error(), tc.want)
			if tc.is != nil {
				require.ErrorIs(t, err, tc.is)
			}
		})
	}
}

func TestBadManifests(t *testing.T) {
	good := func() Manifest {
		return Manifest{Version: 1, BlockBytes: 8, World: World{Replicas: 1, Shards: 1}, Files: []FileMeta{{Name: "shard-00000.bin", Bytes: 40}},
			Tensors: []TensorMeta{{Name: "w", DType: "float32", Shape: []int64{10}, Chunks: []Chunk{
				{Offset: 0, Length: 4, File: "shard-00000.bin", ByteOffset: 0, CRC32C: []uint32{1, 2}},
				{Offset: 4, Length: 6, File: "shard-00000.bin", ByteOffset: 16, CRC32C: []uint32{1, 2, 3}},
			}}}}
	}
	tests := []struct {
		name   string
		change func(*Manifest)
		want   string
	}{
		{"newer version", func(m *Manifest) { m.Version = 2 }, "format_version 2"},
		{"no block size", func(m *Manifest) { m.BlockBytes = 0 }, "block_bytes 0"},
		{"path in file name", func(m *Manifest) { m.Files[0].Name = "../x" }, `bad data file name "../x"`},
		{"dtype", func(m *Manifest) { m.Tensors[0].DType = "bfloat16" }, `tensor w: dtype "bfloat16"`},
		{"gap", func(m *Manifest) { m.Tensors[0].Chunks[1].Offset = 5; m.Tensors[0].Chunks[1].Length = 5 }, "elements [4, 5) are in no chunk"},
		{"overlap", func(m *Manifest) {
			m.Tensors[0].Chunks[0].Length = 5
			m.Tensors[0].Chunks[0].CRC32C = []uint32{1, 2, 3}
		}, "elements [4, 5) are in more than one chunk"},
		{"short", func(m *Manifest) { m.Tensors[0].Shape = []int64{11} }, "elements [10, 11) are in no chunk"},
		{"past the tensor", func(m *Manifest) { m.Tensors[0].Shape = []int64{9} }, "chunk of 6 elements at 4 outside the tensor's 9 elements"},
		// Sums and products that wrap around an int64 (found by FuzzManifest's seeds: each
		// passed before as a chunk inside its tensor or file).
		{"offset wraps", func(m *Manifest) { m.Tensors[0].Chunks[1].Offset = math.MaxInt64 - 1 }, "outside the tensor's 10 elements"},
		{"byte offset wraps", func(m *Manifest) { m.Tensors[0].Chunks[1].ByteOffset = math.MaxInt64 - 8 }, "outside the file's 40 bytes"},
		{"shape overflows", func(m *Manifest) { m.Tensors[0].Shape = []int64{1 << 32, 1 << 32, 10} }, "has more than"},
		{"huge block", func(m *Manifest) { m.BlockBytes = math.MaxInt64 }, "block_bytes 9223372036854775807 must be between 1 and"},
		{"negative step", func(m *Manifest) { m.Step = -1 }, "step -1 and sample_index 0 must not be negative"},
		{"no world", func(m *Manifest) { m.World = World{} }, "world 0x0"},
		{"past the file", func(m *Manifest) { m.Files[0].Bytes = 39 }, "outside the file's 39 bytes"},
		{"checksums", func(m *Manifest) { m.Tensors[0].Chunks[1].CRC32C = []uint32{1} }, "1 checksums for 3 blocks"},
		{"unlisted file", func(m *Manifest) { m.Tensors[0].Chunks[1].File = "shard-00009.bin" }, `unlisted file "shard-00009.bin"`},
		{"repeated tensor", func(m *Manifest) { m.Tensors = append(m.Tensors, m.Tensors[0]) }, "name empty or repeated"},
	}
	m := good()
	require.NoError(t, m.validate())
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := good()
			tc.change(&m)
			dir := t.TempDir()
			b, err := json.Marshal(m)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(dir, ManifestName), b, 0o644))
			_, err = ReadManifest(dir)
			var ce *CorruptError
			require.ErrorAs(t, err, &ce)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	t.Run("not JSON", func(t *testing.T) {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, ManifestName), []byte("{"), 0o644))
		_, err := ReadManifest(dir)
		var ce *CorruptError
		require.ErrorAs(t, err, &ce)
	})
}

func TestKeepAndCleanup(t *testing.T) {
	specs := testSpecs()
	dir := t.TempDir()
	w := World{Replicas: 2, Shards: 1}
	// Leftovers of crashed saves: a temporary directory and a step directory without manifest.
	require.NoError(t, os.MkdirAll(filepath.Join(dir, ".tmp-step-00000003-deadbeef"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, StepName(2)), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o644))
	entries, err := List(dir)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	require.False(t, entries[0].Complete)
	require.True(t, entries[1].Temp)

	for step := int64(1); step <= 5; step++ {
		saveWorld(t, dir, w, step*10, specs, makeState(specs, step), func(c *Config) { c.Keep = 2 })
	}
	entries, err = List(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name)
		require.True(t, e.Complete)
	}
	require.Equal(t, []string{StepName(40), StepName(50)}, names)
	_, err = os.Stat(filepath.Join(dir, "notes.txt"))
	require.NoError(t, err, "files that are not ours stay")
}

func TestSaveSameStepReplaces(t *testing.T) {
	specs := testSpecs()
	dir := t.TempDir()
	w := World{Replicas: 1, Shards: 2}
	saveWorld(t, dir, w, 7, specs, makeState(specs, 1), nil)
	state := makeState(specs, 2)
	saveWorld(t, dir, w, 7, specs, state, nil)
	loaded, reqs, errs := loadWorld(w, dir, specs)
	for r := range errs {
		require.NoError(t, errs[r])
		require.Equal(t, int64(7), loaded[r].Manifest.Step)
		requireHolds(t, state, reqs[r])
	}
	entries, err := List(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1)
}

func TestSaveRejectsInconsistentRanks(t *testing.T) {
	specs := testSpecs()
	dir := t.TempDir()
	w := World{Replicas: 2, Shards: 1}
	state := makeState(specs, 1)
	errs := onRanks(w, func(ctx context.Context, c Coordinator) error {
		s, err := NewSaver(Config{Dir: dir, World: w, Coord: c})
		if err != nil {
			return err
		}
		ts := rankTensors(specs, state, w, c.Rank())
		if c.Rank() == 1 { // a replica that disagrees about the shape
			ts[0].Shape = []int64{257, 62}
		}
		return s.Save(ctx, Meta{Step: 1}, ts)
	})
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
	}
	require.Contains(t, errs[0].Error(), "tensor wte: rank 1 gives shape [257 62]")
	require.Contains(t, errs[1].Error(), "aborted by rank 0")
	entries, err := List(dir)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing committed, the temporary directory removed")
}

func TestConfigAndInputErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no dir", Config{World: World{1, 1, ""}}, "Config.Dir is empty"},
		{"bad world", Config{Dir: "x", World: World{0, 1, ""}}, "world 0x1"},
		{"size mismatch", Config{Dir: "x", World: World{2, 1, ""}}, "world 2x1 has 2 ranks, the coordinator 1"},
		{"negative keep", Config{Dir: "x", World: World{1, 1, ""}, Keep: -1}, "Keep -1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewSaver(tc.cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}
	s, err := NewSaver(Config{Dir: t.TempDir(), World: World{1, 1, ""}})
	require.NoError(t, err)
	ctx := context.Background()
	for _, ts := range [][]Tensor{
		{{Name: "a", Shape: []int64{2}, Data: make([]float32, 3)}},
		{{Name: "a", Shape: []int64{-1}}},
		{{Name: ""}},
		{{Name: "a"}, {Name: "a"}},
	} {
		require.Error(t, s.Save(ctx, Meta{Step: 1}, ts))
		require.Error(t, s.SaveAsync(ctx, Meta{Step: 1}, ts))
	}
	require.NoError(t, s.Close())
}

func TestAsyncSaveCopiesAtTheCall(t *testing.T) {
	specs := testSpecs()
	dir := t.TempDir()
	w := World{Replicas: 2, Shards: 2}
	want := map[int64]map[string][]float32{}
	errs := onRanks(w, func(ctx context.Context, c Coordinator) error {
		s, err := NewSaver(Config{Dir: dir, World: w, Coord: c, BlockBytes: 4096})
		if err != nil {
			return err
		}
		defer s.Close()
		// One live state that "training" keeps changing while saves run.
		live := makeState(specs, 0)
		for step := int64(1); step <= 3; step++ {
			for _, d := range live {
				for i := range d {
					d[i] += 1
				}
			}
			if c.Rank() == 0 {
				snap := map[string][]float32{}
				for k, v := range live {
					snap[k] = append(make([]float32, 0, len(v)), v...)
				}
				want[step] = snap
			}
			if err := s.SaveAsync(ctx, Meta{Step: step}, rankTensors(specs, live, w, c.Rank())); err != nil {
				return err
			}
			for _, d := range live { // scribble while the save runs
				for i := range d {
					d[i] -= 0.5
				}
			}
			for _, d := range live {
				for i := range d {
					d[i] += 0.5
				}
			}
		}
		return s.Wait()
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	for step := int64(1); step <= 3; step++ {
		ck, err := Open(filepath.Join(dir, StepName(step)))
		require.NoError(t, err)
		for _, s := range specs {
			got := make([]float32, numel(s.shape))
			require.NoError(t, ck.Read(s.name, 0, got))
			require.Equal(t, want[step][s.name], got, "step %d tensor %s", step, s.name)
		}
		require.NoError(t, ck.Close())
	}
}

func TestAsyncSaveReportsErrorOnce(t *testing.T) {
	dir := t.TempDir()
	blocker := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(blocker, nil, 0o644))
	s, err := NewSaver(Config{Dir: filepath.Join(blocker, "ckpt"), World: World{1, 1, ""}})
	require.NoError(t, err)
	ts := []Tensor{{Name: "a", Shape: []int64{1}, Data: []float32{1}}}
	require.NoError(t, s.SaveAsync(context.Background(), Meta{Step: 1}, ts))
	err = s.SaveAsync(context.Background(), Meta{Step: 2}, ts)
	require.ErrorContains(t, err, "save step-00000001")
	require.ErrorContains(t, s.Wait(), "save step-00000002")
	require.NoError(t, s.Wait())
}

func TestLocalGroupCancel(t *testing.T) {
	g := NewLocalGroup(2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := g[0].GatherBytes(ctx, []byte("x"))
	require.ErrorIs(t, err, context.Canceled)
	_, err = g[1].BroadcastBytes(context.Background(), nil)
	require.Error(t, err, "the group is broken for good")
	require.True(t, errors.Is(err, context.Canceled))
}
