package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// writeBytes is the size of one pwrite: large sequential writes, a few checksum blocks each.
const writeBytes = 8 << 20

// Tensor is the part of a named tensor that this rank holds: the elements
// [Offset, Offset+len(Data)) of the flat tensor of global shape Shape. Every replica of a shard
// passes the same tensors with the same offsets and data.
type Tensor struct {
	Name   string
	Shape  []int64
	Offset int64
	Data   []float32
}

// Meta is the training state saved beside the tensors.
type Meta struct {
	Step        int64
	SampleIndex int64
	// RNG is opaque: saved and returned as given.
	RNG        []byte
	ConfigHash string
}

// Config says where and how a Saver writes.
type Config struct {
	// Dir holds one step-%08d directory per checkpoint; it is created if missing.
	Dir string
	// World is the layout of the saving ranks; Coord.Size() must equal World.Size().
	World World
	// Coord connects the ranks; nil means a single process (World 1x1).
	Coord Coordinator
	// Keep is how many of the newest complete checkpoints rank 0 keeps after a save; 0 keeps all.
	Keep int
	// BlockBytes is the checksum block size; 0 means DefaultBlockBytes.
	BlockBytes int64
	// Progress, if set, is called by the writing goroutine after each write with the bytes this
	// rank has written of its file so far and the total (for progress reports and fault tests).
	Progress func(written, total int64)
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	if c.Dir == "" {
		return errors.New("checkpoint: Config.Dir is empty")
	}
	if err := c.World.Validate(); err != nil {
		return err
	}
	size := 1
	if c.Coord != nil {
		size = c.Coord.Size()
	}
	if size != c.World.Size() {
		return fmt.Errorf("checkpoint: world %s has %d ranks, the coordinator %d", c.World, c.World.Size(), size)
	}
	if c.Keep < 0 || c.BlockBytes < 0 {
		return fmt.Errorf("checkpoint: Keep %d and BlockBytes %d must not be negative", c.Keep, c.BlockBytes)
	}
	if c.BlockBytes > MaxBlockBytes {
		return fmt.Errorf("checkpoint: BlockBytes %d is over the %d a reader accepts", c.BlockBytes, MaxBlockBytes)
	}
	return nil
}

// Saver writes checkpoints of one rank. Every rank of the world makes its own Saver and calls
// Save (or SaveAsync) for the same steps in the same order. Its methods are meant to be called
// from one goroutine, the training loop.
type Saver struct {
	cfg        Config
	coord      Coordinator
	table      *crc32.Table
	writeBytes int64 // bytes per pwrite; tests make it small

	mu       sync.Mutex
	inflight chan struct{} // closed when the background save ends; nil if none
	lastErr  error         // of the last background save, until reported
	bufs     [][]float32   // async copies, reused between saves
}

// NewSaver checks cfg and returns a Saver; it touches no files.
func NewSaver(cfg Config) (*Saver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.BlockBytes == 0 {
		cfg.BlockBytes = DefaultBlockBytes
	}
	coord := cfg.Coord
	if coord == nil {
		coord = Solo()
	}
	return &Saver{cfg: cfg, coord: coord, table: crc32.MakeTable(crc32.Castagnoli), writeBytes: writeBytes}, nil
}

// Save writes the checkpoint of meta.Step and returns once it is committed on every rank. It
// first waits for a background save in flight (whose error it then leaves to Wait). The commit
// protocol: rank 0 makes a temporary directory .tmp-step-N-<token>; every rank writes and fsyncs
// its file; the ranks report to rank 0 (a gather, which is the barrier); rank 0 checks every
// element of every tensor is written exactly once, writes manifest.json last, fsyncs it and the
// directory, renames the directory to step-N (atomically swapping out an older step-N) and
// fsyncs the parent, then removes checkpoints beyond Keep and leftovers of failed saves. Replicas
// of a shard split its data, each writing 1/Replicas of it. Any rank's failure aborts the save
// on every rank, removes the temporary directory, and leaves earlier checkpoints as they were;
// the error names the rank and file. ctx bounds the collectives and stops the writes.
func (s *Saver) Save(ctx context.Context, meta Meta, tensors []Tensor) error {
	s.waitInflight()
	return s.save(ctx, meta, tensors)
}

// SaveAsync copies the tensors to memory owned by the Saver and returns, leaving the write and
// commit (as Save) to a background goroutine that uses ctx; the caller may change its tensors as
// soon as SaveAsync returns. At most one save is in flight: SaveAsync first waits for the
// previous one. It returns an error if the arguments are bad (nothing is started), or the error
// of the previous background save (the new one is started regardless).
func (s *Saver) SaveAsync(ctx context.Context, meta Meta, tensors []Tensor) error {
	prev := s.Wait()
	if err := checkTensors(tensors); err != nil {
		return errors.Join(prev, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := make([]Tensor, len(tensors))
	if len(s.bufs) != len(tensors) {
		s.bufs = make([][]float32, len(tensors))
	}
	for i, t := range tensors {
		if cap(s.bufs[i]) < len(t.Data) {
			s.bufs[i] = make([]float32, len(t.Data))
		}
		buf := s.bufs[i][:len(t.Data)]
		copy(buf, t.Data)
		snap[i] = Tensor{Name: t.Name, Shape: slices.Clone(t.Shape), Offset: t.Offset, Data: buf}
	}
	meta.RNG = slices.Clone(meta.RNG)
	done := make(chan struct{})
	s.inflight = done
	go func() {
		err := s.save(ctx, meta, snap)
		s.mu.Lock()
		s.lastErr = err
		s.inflight = nil
		s.mu.Unlock()
		close(done)
	}()
	return prev
}

// Wait blocks until no background save is in flight and returns the error of the last one if it
// was not reported yet (each error is reported once).
func (s *Saver) Wait() error {
	s.waitInflight()
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.lastErr
	s.lastErr = nil
	return err
}

// Close waits for a background save and returns its unreported error; the Saver keeps no other
// resources.
func (s *Saver) Close() error { return s.Wait() }

func (s *Saver) waitInflight() {
	s.mu.Lock()
	done := s.inflight
	s.mu.Unlock()
	if done != nil {
		<-done
	}
}

func checkTensors(tensors []Tensor) error {
	seen := map[string]bool{}
	for _, t := range tensors {
		if t.Name == "" || seen[t.Name] {
			return fmt.Errorf("checkpoint: tensor name %q empty or repeated", t.Name)
		}
		seen[t.Name] = true
		for _, d := range t.Shape {
			if d < 0 {
				return fmt.Errorf("checkpoint: tensor %s: negative dimension in shape %v", t.Name, t.Shape)
			}
		}
		if n := numel(t.Shape); t.Offset < 0 || t.Offset+int64(len(t.Data)) > n {
			return fmt.Errorf("checkpoint: tensor %s: elements [%d, %d) outside its %d elements (shape %v)",
				t.Name, t.Offset, t.Offset+int64(len(t.Data)), n, t.Shape)
		}
	}
	return nil
}

// rankReport is what each rank tells rank 0 after writing.
type rankReport struct {
	Rank    int          `json:"rank"`
	File    string       `json:"file,omitempty"`
	Bytes   int64        `json:"bytes"`
	Err     string       `json:"err,omitempty"`
	Tensors []TensorMeta `json:"tensors"`
}

// verdict is what rank 0 tells everyone at the start and the end of a save.
type verdict struct {
	Tmp string `json:"tmp,omitempty"`
	Err string `json:"err,omitempty"`
}

func (s *Saver) save(ctx context.Context, meta Meta, tensors []Tensor) error {
	rank := s.coord.Rank()
	step := StepName(meta.Step)
	fail := func(err error) error { return fmt.Errorf("checkpoint: save %s: %w", step, err) }

	// 1. Rank 0 makes the temporary directory and tells everyone its name.
	var start verdict
	if rank == 0 {
		if err := checkTensors(tensors); err != nil {
			start.Err = err.Error()
		} else if tmp, err := s.makeTmp(meta.Step); err != nil {
			start.Err = err.Error()
		} else {
			start.Tmp = tmp
		}
	}
	b, err := s.coord.BroadcastBytes(ctx, mustJSON(start))
	if err != nil {
		if start.Tmp != "" {
			os.RemoveAll(filepath.Join(s.cfg.Dir, start.Tmp))
		}
		return fail(err)
	}
	if err := json.Unmarshal(b, &start); err != nil {
		return fail(fmt.Errorf("bad start message from rank 0: %w", err))
	}
	if start.Err != "" {
		if rank == 0 {
			return fail(errors.New(start.Err))
		}
		return fail(fmt.Errorf("rank 0: %s", start.Err))
	}
	tmp := filepath.Join(s.cfg.Dir, start.Tmp)

	// 2. Every rank writes and fsyncs its file, then reports, failure included, to rank 0.
	rep := s.writeShard(ctx, tmp, tensors)
	all, gerr := s.coord.GatherBytes(ctx, mustJSON(rep))
	if rank != 0 {
		if gerr != nil {
			return fail(gerr)
		}
		b, err := s.coord.BroadcastBytes(ctx, nil)
		if err != nil {
			return fail(err)
		}
		var end verdict
		if err := json.Unmarshal(b, &end); err != nil {
			return fail(fmt.Errorf("bad result message from rank 0: %w", err))
		}
		if end.Err != "" {
			if rep.Err != "" {
				return fail(errors.New(rep.Err))
			}
			return fail(fmt.Errorf("aborted by rank 0: %s", end.Err))
		}
		return nil
	}

	// 3. Rank 0 commits or aborts, and tells everyone.
	cerr := gerr
	if cerr == nil {
		cerr = s.commit(tmp, meta, all)
	}
	var end verdict
	if cerr != nil {
		os.RemoveAll(tmp)
		end.Err = cerr.Error()
	}
	_, berr := s.coord.BroadcastBytes(ctx, mustJSON(end))
	switch {
	case cerr != nil:
		return fail(cerr)
	case berr != nil:
		return fail(fmt.Errorf("committed, but telling the other ranks failed: %w", berr))
	}
	// The others are released; removing old checkpoints is rank 0's alone.
	if err := s.prune(); err != nil {
		return fmt.Errorf("checkpoint: saved %s, but removing old checkpoints failed: %w", step, err)
	}
	return nil
}

// makeTmp creates Dir and a fresh temporary directory for step; it returns the latter's name.
func (s *Saver) makeTmp(step int64) (string, error) {
	if err := os.MkdirAll(s.cfg.Dir, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", s.cfg.Dir, err)
	}
	var token [6]byte
	if _, err := rand.Read(token[:]); err != nil {
		return "", fmt.Errorf("random token: %w", err)
	}
	name := fmt.Sprintf("%s%08d-%s", tmpPrefix, step, hex.EncodeToString(token[:]))
	if err := os.Mkdir(filepath.Join(s.cfg.Dir, name), 0o755); err != nil {
		return "", fmt.Errorf("create temporary directory: %w", err)
	}
	return name, nil
}

// piece is a run of elements one rank writes.
type piece struct {
	t      *Tensor
	lo, hi int64 // indices into t.Data
}

// writeShard writes this rank's share of tensors into tmp/shard-RANK.bin and fsyncs it. Replicas
// of a shard split each tensor's data Replicas ways so the shard is written once in all.
func (s *Saver) writeShard(ctx context.Context, tmp string, tensors []Tensor) rankReport {
	rank := s.coord.Rank()
	replica, _ := s.cfg.World.Coords(rank)
	rep := rankReport{Rank: rank, Tensors: make([]TensorMeta, len(tensors))}
	if err := checkTensors(tensors); err != nil {
		rep.Err = fmt.Sprintf("rank %d: %v", rank, err)
		return rep
	}
	var pieces []piece
	var total int64
	for i := range tensors {
		t := &tensors[i]
		rep.Tensors[i] = TensorMeta{Name: t.Name, DType: DTypeFloat32, Shape: append([]int64{}, t.Shape...), Chunks: []Chunk{}}
		lo, hi := ShardRange(int64(len(t.Data)), replica, s.cfg.World.Replicas)
		if hi > lo {
			pieces = append(pieces, piece{t: t, lo: lo, hi: hi})
			total += (hi - lo) * elemBytes
		}
	}
	if total == 0 {
		return rep
	}
	rep.File = shardFileName(rank)
	path := filepath.Join(tmp, rep.File)
	chunks, err := s.writeFile(ctx, path, pieces, total)
	if err != nil {
		rep.Err = fmt.Sprintf("rank %d: %v", rank, err)
		return rep
	}
	for i, p := range pieces {
		for j := range rep.Tensors {
			if rep.Tensors[j].Name == p.t.Name {
				rep.Tensors[j].Chunks = append(rep.Tensors[j].Chunks, chunks[i])
			}
		}
	}
	rep.Bytes = total
	return rep
}

// writeFile writes pieces back to back into a new file at path, checksumming each block, and
// fsyncs it. It returns one chunk per piece.
func (s *Saver) writeFile(ctx context.Context, path string, pieces []piece, total int64) ([]Chunk, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	defer f.Close()
	// Reserve the space up front: a full disk fails here, before anything is written.
	if err := unix.Fallocate(int(f.Fd()), 0, 0, total); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
		return nil, fmt.Errorf("reserve %d bytes for %s: %w", total, path, err)
	}
	bb := s.cfg.BlockBytes
	per := max(s.writeBytes/bb, 1) * bb
	chunks := make([]Chunk, len(pieces))
	var off int64
	for i, p := range pieces {
		data := toFile(p.t.Data[p.lo:p.hi])
		ch := Chunk{Offset: p.t.Offset + p.lo, Length: p.hi - p.lo, File: filepath.Base(path), ByteOffset: off,
			CRC32C: make([]uint32, 0, blocks(int64(len(data)), bb))}
		for w := int64(0); w < int64(len(data)); w += per {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("write %s: %w", path, err)
			}
			buf := data[w:min(w+per, int64(len(data)))]
			for k := int64(0); k < int64(len(buf)); k += bb {
				ch.CRC32C = append(ch.CRC32C, crc32.Checksum(buf[k:min(k+bb, int64(len(buf)))], s.table))
			}
			if _, err := f.WriteAt(buf, off); err != nil {
				return nil, fmt.Errorf("write %s: %w", path, err)
			}
			// Start writing this window back now, without waiting (as RocksDB's bytes_per_sync):
			// the disk works while the next window is copied and the final fsync finds little left.
			_ = unix.SyncFileRange(int(f.Fd()), off, int64(len(buf)), unix.SYNC_FILE_RANGE_WRITE)
			off += int64(len(buf))
			if s.cfg.Progress != nil {
				s.cfg.Progress(off, total)
			}
		}
		chunks[i] = ch
	}
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("fsync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("close %s: %w", path, err)
	}
	return chunks, nil
}

// commit is rank 0's part: merge the reports into a manifest, check it, write it last, and
// rename the directory into place.
func (s *Saver) commit(tmp string, meta Meta, reports [][]byte) error {
	m := &Manifest{Version: FormatVersion, Step: meta.Step, SampleIndex: meta.SampleIndex, RNG: meta.RNG,
		ConfigHash: meta.ConfigHash, World: s.cfg.World, Created: time.Now().UTC(), BlockBytes: s.cfg.BlockBytes,
		Files: []FileMeta{}, Tensors: []TensorMeta{}}
	index := map[string]int{}
	var failed []string
	for r, b := range reports {
		var rep rankReport
		if err := json.Unmarshal(b, &rep); err != nil {
			return fmt.Errorf("bad report from rank %d: %w", r, err)
		}
		if rep.Err != "" {
			failed = append(failed, rep.Err)
			continue
		}
		if rep.File != "" {
			m.Files = append(m.Files, FileMeta{Name: rep.File, Bytes: rep.Bytes, Rank: rep.Rank})
		}
		for _, t := range rep.Tensors {
			i, ok := index[t.Name]
			if !ok {
				index[t.Name] = len(m.Tensors)
				m.Tensors = append(m.Tensors, t)
				continue
			}
			if !slices.Equal(m.Tensors[i].Shape, t.Shape) {
				return fmt.Errorf("tensor %s: rank %d gives shape %v, an earlier rank %v", t.Name, rep.Rank, t.Shape, m.Tensors[i].Shape)
			}
			m.Tensors[i].Chunks = append(m.Tensors[i].Chunks, t.Chunks...)
		}
	}
	if len(failed) > 0 {
		return errors.New(strings.Join(failed, "; "))
	}
	if err := m.validate(); err != nil {
		return fmt.Errorf("the ranks' tensors do not form a checkpoint (do all replicas of a shard pass the same tensors?): %w", err)
	}
	b, err := json.MarshalIndent(m, "", " ")
	if err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	if err := writeFileSync(filepath.Join(tmp, ManifestName), b); err != nil {
		return err
	}
	if err := syncDir(tmp); err != nil {
		return err
	}
	if err := replaceDir(tmp, filepath.Join(s.cfg.Dir, StepName(meta.Step))); err != nil {
		return err
	}
	return syncDir(s.cfg.Dir)
}

// writeFileSync writes b to a new file at path and fsyncs it.
func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// syncDir fsyncs a directory, making the names in it durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// replaceDir renames tmp to final. If final exists (the same step saved again) the two are
// swapped atomically (renameat2 RENAME_EXCHANGE) and the old one, now at tmp, removed, so a
// step-N with a manifest is visible at every instant; where the exchange is unsupported the
// old one is renamed aside first.
func replaceDir(tmp, final string) error {
	err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, final, unix.RENAME_NOREPLACE)
	if err == nil {
		return nil
	}
	if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
		if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, final, unix.RENAME_EXCHANGE); err == nil {
			return os.RemoveAll(tmp)
		}
		aside := filepath.Join(filepath.Dir(final), oldPrefix+strings.TrimPrefix(filepath.Base(tmp), tmpPrefix))
		if err := os.Rename(final, aside); err != nil {
			return fmt.Errorf("move the old %s aside: %w", final, err)
		}
		if err := os.Rename(tmp, final); err != nil {
			return fmt.Errorf("rename %s to %s: %w", tmp, final, err)
		}
		return os.RemoveAll(aside)
	}
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) { // no renameat2 flags here
		if err := os.Rename(tmp, final); err != nil {
			return fmt.Errorf("rename %s to %s: %w", tmp, final, err)
		}
		return nil
	}
	return fmt.Errorf("rename %s to %s: %w", tmp, final, err)
}

// prune keeps the newest Keep complete checkpoints and removes leftovers of failed saves
// (temporary directories, step directories without a manifest). It runs on rank 0 after a
// commit, when no other save of this directory is in flight.
func (s *Saver) prune() error {
	entries, err := List(s.cfg.Dir)
	if err != nil {
		return err
	}
	var errs []error
	kept := 0
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		switch {
		case !e.Complete:
			errs = append(errs, os.RemoveAll(e.Path))
		case s.cfg.Keep > 0 && kept >= s.cfg.Keep:
			// Unlink the manifest first: a half-removed directory is then not a checkpoint.
			if err := os.Remove(filepath.Join(e.Path, ManifestName)); err != nil {
				errs = append(errs, err)
				continue
			}
			errs = append(errs, os.RemoveAll(e.Path))
		default:
			kept++
		}
	}
	return errors.Join(errs...)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil { // only plain structs of strings, numbers and slices are encoded here
		panic(fmt.Sprintf("checkpoint: encode %T: %v", v, err))
	}
	return b
}
