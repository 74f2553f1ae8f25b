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

// Scan verifies every file dst/step-<12 digits>/rank-<R>.slot (reading it
// whole: its header and its payload's CRC-32) and returns a Holding, Path
// set, for each complete one whose header names rank R and the directory's
// step, ordered by rank, then step. Incomplete and corrupt files and files
// whose header disagrees with their name are left out; temporary copies and
// other names are ignored. It returns an error naming the path when dst
// (an error wrapping fs.ErrNotExist when it does not exist: nothing was
// persisted there), a step directory or a file cannot be read.
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
			v, err := snapshot.Verify(filepath.Join(s.path, e.Name()))
			if errors.Is(err, snapshot.ErrIncomplete) || errors.Is(err, snapshot.ErrCorrupt) ||
				(err == nil && (v.Rank != r || v.Step != s.step)) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("durable: scan: %w", err)
			}
			out = append(out, snapshot.Holding{Rank: v.Rank, World: v.World, Step: v.Step, Replicated: v.Replicated(), Path: v.Path})
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

// Find verifies the durable file of rank at step in dst (as Scan would)
// and returns its Holding: what an agent that agreed on a durable source
// (rank, step) passes to Load, without scanning the whole directory. It
// returns an error naming the path, wrapping fs.ErrNotExist when there is
// no such file, snapshot.ErrIncomplete or snapshot.ErrCorrupt when it does
// not verify, or saying what it holds when that is another rank or step.
func Find(dst string, rank int, step uint64) (snapshot.Holding, error) {
	v, err := snapshot.Verify(filepath.Join(dst, stepDir(step), slotName(rank)))
	if err != nil {
		return snapshot.Holding{}, fmt.Errorf("durable: find: %w", err)
	}
	if v.Rank != rank || v.Step != step {
		return snapshot.Holding{}, fmt.Errorf("durable: find: %s holds rank %d at step %d, not rank %d at step %d",
			v.Path, v.Rank, v.Step, rank, step)
	}
	return snapshot.Holding{Rank: v.Rank, World: v.World, Step: v.Step, Replicated: v.Replicated(), Path: v.Path}, nil
}

// Load copies the durable snapshot h (from Scan) into the local slots dst
// with RankSlots.Write, which checks the payload's CRC-32 as it copies and
// writes the header last: a copy that disagrees is an error wrapping
// snapshot.ErrCorrupt and leaves no complete slot behind. The snapshot
// keeps its step, flags and world; its rank becomes dst's. The caller
// passes the slots of h.Rank unless h is Replicated (the worker refuses a
// sharded snapshot of another rank). It returns an error naming h.Path when
// the file cannot be read or no longer holds h.
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
		return fmt.Errorf("durable: load of %s: %w", h.Path, err)
	}
	return nil
}
