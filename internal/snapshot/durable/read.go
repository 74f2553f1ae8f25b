package durable

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/gorun/gorun/internal/snapshot"
)

// Scan lists every complete file dst/step-<12 digits>/rank-<R>.slot and
// returns a Holding, Path set, for each whose header is whole, names rank R
// and the directory's step, and whose length is the header's, ordered by
// rank, then step. It reads each file's header only, not its payload: the
// payload's CRC-32 is checked when a snapshot is loaded (Load), which puts
// a file that fails it aside. Files with no whole header, cut short, or
// whose header disagrees with their name are left out; temporary copies
// and other names are ignored. It returns an error naming the path when dst
// (an error wrapping fs.ErrNotExist when it does not exist: nothing was
// persisted there), a step directory or a file cannot be read.
//
// Why not the whole file: node rank 0 scans at every round's agreement,
// before any worker starts, and a directory keeps every rank's state for
// its newest steps; reading it all there cost a recovery the time to read
// the whole job's state from storage, even when the memory copies were the
// ones restored.
func Scan(dst string) ([]snapshot.Holding, error) {
	steps, err := stepDirs(dst)
	if err != nil {
		return nil, fmt.Errorf("durable: scan: %w", err)
	}
	var out []snapshot.Holding
	for _, s := range steps {
		entries, err := os.ReadDir(s.path)
		if err != nil {
			return nil, fmt.Errorf("durable: scan: %w", err)
		}
		for _, e := range entries {
			r, ok := parseSlotName(e.Name())
			if !ok || !e.Type().IsRegular() {
				continue
			}
			h, err := readComplete(filepath.Join(s.path, e.Name()))
			if errors.Is(err, snapshot.ErrIncomplete) || errors.Is(err, snapshot.ErrCorrupt) ||
				(err == nil && (h.Rank != r || h.Step != s.step)) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("durable: scan: %w", err)
			}
			out = append(out, h)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Rank != out[j].Rank {
			return out[i].Rank < out[j].Rank
		}
		return out[i].Step < out[j].Step
	})
	return out, nil
}

// readComplete reads the header of the durable file at path and checks
// that the file holds the whole payload it announces (its payload is not
// read). The error wraps snapshot.ErrIncomplete (no whole header),
// snapshot.ErrCorrupt (cut short) or the I/O error, and names path.
func readComplete(path string) (snapshot.Holding, error) {
	h, err := snapshot.ReadHeader(path)
	if err != nil {
		return snapshot.Holding{}, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return snapshot.Holding{}, fmt.Errorf("snapshot: %w", err)
	}
	if want := int64(snapshot.HeaderSize) + int64(h.Length); st.Size() < want {
		return snapshot.Holding{}, fmt.Errorf("%s: %w: %d bytes, the header says %d", path, snapshot.ErrCorrupt, st.Size(), want)
	}
	return snapshot.Holding{Rank: h.Rank, World: h.World, Step: h.Step, Replicated: h.Replicated(), Path: path}, nil
}

// Find checks the durable file of rank at step in dst as Scan would (its
// header and length; Load checks the payload) and returns its Holding:
// what an agent that agreed on a durable source (rank, step) passes to
// Load, without scanning the whole directory. It returns an error naming
// the path, wrapping fs.ErrNotExist when there is no such file,
// snapshot.ErrIncomplete or snapshot.ErrCorrupt when it is not complete,
// or saying what it holds when that is another rank or step.
func Find(dst string, rank int, step uint64) (snapshot.Holding, error) {
	h, err := readComplete(filepath.Join(dst, stepDir(step), slotName(rank)))
	if err != nil {
		return snapshot.Holding{}, fmt.Errorf("durable: find: %w", err)
	}
	if h.Rank != rank || h.Step != step {
		return snapshot.Holding{}, fmt.Errorf("durable: find: %s holds rank %d at step %d, not rank %d at step %d",
			h.Path, h.Rank, h.Step, rank, step)
	}
	return h, nil
}

// Load copies the durable snapshot h (from Scan) into the local slots dst
// with RankSlots.Write, which checks the payload's CRC-32 as it copies and
// writes the header last: a copy that disagrees is an error wrapping
// snapshot.ErrCorrupt and leaves no complete slot behind. The snapshot
// keeps its step, flags and world; its rank becomes dst's. The caller
// passes the slots of h.Rank unless h is Replicated (the worker refuses a
// sharded snapshot of another rank). It returns an error naming h.Path when
// the file cannot be read or no longer holds h. A file whose payload fails
// its CRC is renamed <name>.corrupt (kept for whoever looks into it), so
// that no later Scan offers it: the next agreement picks another source.
func Load(h snapshot.Holding, dst *snapshot.RankSlots) error {
	f, err := os.Open(h.Path)
	if err != nil {
		return fmt.Errorf("durable: load: %w", err)
	}
	defer f.Close()
	var b [snapshot.HeaderLen]byte
	if _, err := f.ReadAt(b[:], 0); err != nil {
		return fmt.Errorf("durable: load: %s: %w", h.Path, err)
	}
	sh, err := snapshot.ParseHeader(b[:])
	if err != nil {
		return fmt.Errorf("durable: load: %s: %w", h.Path, err)
	}
	if sh.Rank != h.Rank || sh.World != h.World || sh.Step != h.Step || sh.Replicated() != h.Replicated {
		return fmt.Errorf("durable: load: %s holds rank %d of %d at step %d now, not rank %d of %d at step %d: scan again",
			h.Path, sh.Rank, sh.World, sh.Step, h.Rank, h.World, h.Step)
	}
	payload := io.NewSectionReader(f, snapshot.HeaderSize, int64(sh.Length))
	if err := dst.Write(sh, payload); err != nil {
		if errors.Is(err, snapshot.ErrCorrupt) {
			if rerr := os.Rename(h.Path, h.Path+corruptSuffix); rerr != nil {
				err = errors.Join(err, fmt.Errorf("putting it aside: %w", rerr))
			} else {
				err = fmt.Errorf("%w (put aside as %s%s)", err, filepath.Base(h.Path), corruptSuffix)
			}
		}
		return fmt.Errorf("durable: load of %s: %w", h.Path, err)
	}
	return nil
}

// corruptSuffix is added to the name of a durable file whose payload
// failed its CRC at a load: Scan ignores the name.
const corruptSuffix = ".corrupt"
