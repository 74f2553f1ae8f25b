package durable

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/snapshot"
)

// pollInterval is how often Persist reads the slots' headers: short beside
// a training step, since a slot of step s is overwritten when the save of
// step s+2 begins.
const pollInterval = 10 * time.Millisecond

// chunk is the size of the reads and writes of a copy.
const chunk = 4 << 20

// errOverwritten means the worker rewrote the slot while it was copied:
// the copy is dropped, and the next step that is due gets its chance.
var errOverwritten = errors.New("durable: the slot was overwritten while it was copied")

// Persist writes, until ctx ends, every snapshot of the given global ranks
// whose step is a multiple of every, as the agent's snapshot directory src
// holds them, to dst/step-<12 digits>/rank-<R>.slot: the slot file as it
// was (header and payload), copied to a temporary name in that directory,
// its payload's CRC-32 checked against the header (a copy of a slot that
// the worker began to overwrite meanwhile is dropped), fsynced, read back
// and verified, renamed, and the directory fsynced. So a file under its
// final name is always a whole, verified snapshot, whenever the process
// dies. A step directory is created with mode 0700, a file 0600.
//
// It polls the slots' headers (snapshot.Watch), each rank in its own
// goroutine, and never writes to src nor makes the worker wait: a step
// whose slot is overwritten before its copy is done is not persisted
// (logged), and the next step that is due is tried.
//
// After each copy it keeps the newest keep complete step directories, a
// complete one holding a file of every rank 0..W-1 of one world W (the
// files of other nodes included), and in the directories older than those
// it deletes the files of its own ranks (their temporary copies too) and
// the directory once it is empty. A step being written, or one another node
// failed to copy, never pushes out the newest complete one; while fewer
// than keep are complete nothing is deleted.
//
// Persist returns an error, before it starts, naming the argument when one
// is invalid, or when dst cannot be created; later a failed copy is logged
// (log, with component "durable") and never ends it. It returns nil when
// ctx ends, having removed the temporary copy it was writing, and an error
// when a slot of src cannot be read.
func Persist(ctx context.Context, src string, ranks []int, dst string, every, keep int, log zerolog.Logger) error {
	p, err := newPersister(src, ranks, dst, every, keep, log)
	if err != nil {
		return err
	}
	return p.run(ctx)
}

// point is a place in a copy where a test hook runs.
type point int

const (
	atCopying   point = iota // the first chunk of the payload is in the temporary file
	atSynced                 // the temporary file is synced, not yet read back
	atWritten                // the temporary file is synced and verified, not yet renamed
	atRenamed                // renamed, the directory not yet synced
	atPersisted              // persisted, the older steps pruned
	atDropped                // dropped: the slot changed while it was copied
	atFailed                 // failed otherwise (logged)
	atSkipped                // not copied: another rank's state, or persisted before
)

// persister is one Persist.
type persister struct {
	src, dst string
	ranks    []int
	own      map[int]bool // ranks as a set
	every    uint64
	keep     int
	log      zerolog.Logger
	poll     time.Duration
	chunk    int // bytes a read and write of a copy
	// hook, for tests only, runs at each point of a copy of rank's step.
	hook    func(at point, rank int, step uint64)
	pruning sync.Mutex // held by the one goroutine that prunes
}

// newPersister checks Persist's arguments.
func newPersister(src string, ranks []int, dst string, every, keep int, log zerolog.Logger) (*persister, error) {
	switch {
	case src == "":
		return nil, errors.New("durable: no snapshot directory to copy from")
	case dst == "":
		return nil, errors.New("durable: no durable directory (--snapshot-durable) to copy to")
	case every < 1:
		return nil, fmt.Errorf("durable: every %d: persist every Nth snapshot with N >= 1 (--snapshot-durable-every)", every)
	case keep < 1:
		return nil, fmt.Errorf("durable: keep %d: keep the newest M steps with M >= 1 (--snapshot-durable-keep)", keep)
	case len(ranks) == 0:
		return nil, errors.New("durable: no ranks to persist")
	}
	own := make(map[int]bool, len(ranks))
	for _, r := range ranks {
		if r < 0 || own[r] {
			return nil, fmt.Errorf("durable: ranks %v: each global rank once, none negative", ranks)
		}
		own[r] = true
	}
	return &persister{
		src: src, dst: dst, ranks: ranks, own: own, every: uint64(every), keep: keep,
		log: log.With().Str("component", "durable").Logger(), poll: pollInterval, chunk: chunk,
	}, nil
}

// run is Persist once its arguments are checked.
func (p *persister) run(ctx context.Context) error {
	if err := p.mkdirDst(); err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	for _, r := range p.ranks {
		g.Go(func() error {
			return snapshot.Watch(ctx, p.src, r, p.poll, func(s snapshot.Slot) error {
				p.take(ctx, r, s)
				return nil
			})
		})
	}
	return g.Wait()
}

// mkdirDst makes the durable directory when it is missing.
func (p *persister) mkdirDst() error {
	if err := os.MkdirAll(p.dst, 0o700); err != nil {
		return fmt.Errorf("durable: cannot make the durable directory: %w", err)
	}
	return nil
}

// at runs the test hook, if any.
func (p *persister) at(at point, rank int, step uint64) {
	if p.hook != nil {
		p.hook(at, rank, step)
	}
}

// take persists the slot s of rank when its step is due (see persist),
// and logs what became of it.
func (p *persister) take(ctx context.Context, rank int, s snapshot.Slot) {
	if s.Step%p.every != 0 {
		return
	}
	log := p.log.With().Int("rank", rank).Uint64("step", s.Step).Logger()
	start := time.Now()
	done, err := p.persist(ctx, rank, s)
	switch {
	case err == nil && done:
		log.Info().Str("path", p.final(s)).Uint64("bytes", s.Length).Dur("took", time.Since(start)).Msg("snapshot persisted")
		p.at(atPersisted, rank, s.Step)
	case err == nil:
		p.at(atSkipped, rank, s.Step)
	case errors.Is(err, errOverwritten):
		log.Warn().Err(err).Msg("durable copy dropped: the worker saved twice before the copy was done; the next due step is tried")
		p.at(atDropped, rank, s.Step)
	case ctx.Err() != nil:
	default:
		log.Error().Err(err).Msg("durable copy failed; the next due step is tried")
		p.at(atFailed, rank, s.Step)
	}
}

// persist copies the slot s of rank to dst unless it need not: a
// replicated state is persisted from rank 0's slot alone (every rank holds
// the same state, and rank 0 saves in every world: the others' copies
// would only multiply what shared storage takes), a slot whose header
// names another rank is not (logged), and a step dst holds already is
// not copied again. After a copy it prunes the older steps (a failure to
// is logged). It reports whether it copied, and the copy's error.
func (p *persister) persist(ctx context.Context, rank int, s snapshot.Slot) (bool, error) {
	if s.Replicated() && rank != 0 {
		return false, nil
	}
	if s.Rank != rank {
		p.log.Warn().Int("rank", rank).Uint64("step", s.Step).Str("path", s.Path).Int("header_rank", s.Rank).
			Msg("the slot's header names another rank: not persisted")
		return false, nil
	}
	final := p.final(s)
	if h, err := snapshot.ReadHeader(final); err == nil && h == s.Header {
		return false, nil // persisted before (a restart of the agent)
	}
	if err := p.copy(ctx, s, final); err != nil {
		return false, err
	}
	if err := p.prune(); err != nil {
		p.log.Warn().Err(err).Int("rank", rank).Uint64("step", s.Step).Msg("cannot delete older durable snapshots")
	}
	return true, nil
}

// final is where the slot s is persisted in dst.
func (p *persister) final(s snapshot.Slot) string {
	return filepath.Join(p.dst, stepDir(s.Step), slotName(s.Rank))
}

// copy writes the slot s to final (see Persist): to a temporary file in
// final's directory, CRC-checked, fsynced, verified when read back,
// renamed, the directory fsynced. On any error the temporary file is
// removed; the error wraps errOverwritten when s changed meanwhile and is
// ctx's when ctx ended.
func (p *persister) copy(ctx context.Context, s snapshot.Slot, final string) (err error) {
	dir := filepath.Dir(final)
	if err := p.mkdir(dir); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, tmpPattern(s.Rank))
	if err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	renamed := false
	defer func() {
		if !renamed {
			err = errors.Join(err, ignoreClosed(tmp.Close()), os.Remove(tmp.Name()))
		}
	}()
	if err := p.copySlot(ctx, s, tmp); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	p.at(atSynced, s.Rank, s.Step)
	if err := readBack(ctx, tmp, s.Header); err != nil {
		return err
	}
	p.at(atWritten, s.Rank, s.Step)
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	if err := os.Rename(tmp.Name(), final); err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	renamed = true
	p.at(atRenamed, s.Rank, s.Step)
	return syncDir(dir)
}

// ignoreClosed drops the error of closing a file closed already.
func ignoreClosed(err error) error {
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}

// mkdir makes the step directory dir in dst, and fsyncs dst when it did.
func (p *persister) mkdir(dir string) error {
	err := os.Mkdir(dir, 0o700)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	return syncDir(p.dst)
}

// copySlot copies the header region and payload of the slot s to w,
// checking the payload's CRC-32 against s's header as it goes. It returns
// an error wrapping errOverwritten when the slot's header is no longer s's
// or the bytes copied disagree with it, and ctx's error when ctx ends
// (checked between chunks).
func (p *persister) copySlot(ctx context.Context, s snapshot.Slot, w io.Writer) error {
	in, err := os.Open(s.Path)
	if err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	defer in.Close()
	buf := make([]byte, max(p.chunk, snapshot.HeaderSize))
	head := buf[:snapshot.HeaderSize]
	if err := readFullAt(in, head, 0); err != nil {
		return err
	}
	if h, err := snapshot.ParseHeader(head); err != nil || h != s.Header {
		return fmt.Errorf("%w: %s no longer holds step %d", errOverwritten, s.Path, s.Step)
	}
	if _, err := w.Write(head); err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	crc := crc32.NewIEEE()
	for off := uint64(0); off < s.Length; {
		if err := ctx.Err(); err != nil {
			return err
		}
		b := buf[:min(uint64(len(buf)), s.Length-off)]
		if err := readFullAt(in, b, int64(snapshot.HeaderSize+off)); err != nil {
			return err
		}
		crc.Write(b)
		if _, err := w.Write(b); err != nil {
			return fmt.Errorf("durable: %w", err)
		}
		if off == 0 {
			p.at(atCopying, s.Rank, s.Step)
		}
		off += uint64(len(b))
	}
	if got := crc.Sum32(); got != s.CRC {
		return fmt.Errorf("%w: the copy of %s has CRC-32 %#08x, its header said %#08x", errOverwritten, s.Path, got, s.CRC)
	}
	return nil
}

// readFullAt fills b from f at off; a file that ends first was truncated
// under the copy (errOverwritten).
func readFullAt(f *os.File, b []byte, off int64) error {
	n, err := f.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: %s ends at %d bytes", errOverwritten, f.Name(), off+int64(n))
	}
	return fmt.Errorf("durable: %w", err)
}

// readBack verifies the synced file f as storage holds it, as
// snapshot.Verify does but checking ctx between chunks, so that a copy of
// a large slot ends promptly too: its cached pages are dropped first (a
// clean page may be; on a network file system this reads from the server),
// and again after, so that durable copies do not fill the page cache. Its
// header must be want and its payload's CRC-32 want.CRC.
func readBack(ctx context.Context, f *os.File, want snapshot.Header) error {
	// Advice only: where it is not taken, the read-back reads the cache.
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	defer unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	var b [snapshot.HeaderLen]byte
	if err := readFullAt(f, b[:], 0); err != nil {
		return err
	}
	h, err := snapshot.ParseHeader(b[:])
	if err == nil && h != want {
		err = fmt.Errorf("the header read back is %+v, not %+v", h, want)
	}
	if err != nil {
		return fmt.Errorf("durable: the copy %s does not read back whole: %w", f.Name(), err)
	}
	crc := crc32.NewIEEE()
	n, err := io.CopyBuffer(crc, ctxReader{ctx, io.NewSectionReader(f, snapshot.HeaderSize, int64(want.Length))}, make([]byte, chunk))
	switch {
	case err != nil:
		return fmt.Errorf("durable: %w", err) // ctx's error among them
	case uint64(n) != want.Length || crc.Sum32() != want.CRC:
		return fmt.Errorf("durable: the copy %s does not read back whole: %w: %d payload bytes with CRC-32 %#08x, want %d with %#08x",
			f.Name(), snapshot.ErrCorrupt, n, crc.Sum32(), want.Length, want.CRC)
	}
	return nil
}

// ctxReader reads r until ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}

// syncDir fsyncs the directory dir, so that the names made or renamed in it
// survive a crash of the machine.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	if err := d.Sync(); err != nil {
		return errors.Join(fmt.Errorf("durable: %w", err), d.Close())
	}
	return d.Close()
}
