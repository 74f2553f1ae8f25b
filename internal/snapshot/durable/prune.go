package durable

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"syscall"

	"github.com/gorun/gorun/internal/snapshot"
)

// prune keeps the newest p.keep complete step directories of dst and, in
// every older step directory, deletes the files of p's ranks (and their
// temporary copies), then the directory when it is empty. With fewer than
// p.keep complete directories it deletes nothing. It returns the errors of
// the deletions, naming the paths.
func (p *persister) prune() error {
	p.pruning.Lock()
	defer p.pruning.Unlock()
	steps, err := stepDirs(p.dst)
	if err != nil {
		return err
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i].step > steps[j].step })
	kept := 0
	for i, s := range steps {
		if !complete(s) {
			continue
		}
		if kept++; kept < p.keep {
			continue
		}
		var errs []error
		for _, old := range steps[i+1:] {
			errs = append(errs, p.removeOwn(old.path))
		}
		return errors.Join(errs...)
	}
	return nil
}

// stepEntry is one step directory of a durable directory.
type stepEntry struct {
	step uint64
	path string
}

// stepDirs lists the step directories of dst; other names are left alone.
func stepDirs(dst string) ([]stepEntry, error) {
	entries, err := os.ReadDir(dst)
	if err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	var out []stepEntry
	for _, e := range entries {
		if step, ok := parseStepDir(e.Name()); ok && e.IsDir() {
			out = append(out, stepEntry{step: step, path: filepath.Join(dst, e.Name())})
		}
	}
	return out, nil
}

// complete reports whether the step directory s holds, for some world size
// W, a file of each rank 0..W-1 whose header says that rank, world W and
// s's step, or one replicated snapshot of s's step (any rank of any world
// restores it). Only headers are read: a file under its final name was
// verified before it got that name. An unreadable directory is incomplete.
func complete(s stepEntry) bool {
	entries, err := os.ReadDir(s.path)
	if err != nil {
		return false
	}
	ranks := map[int]int{} // world -> files of ranks below it
	for _, e := range entries {
		r, ok := parseSlotName(e.Name())
		if !ok {
			continue
		}
		h, err := snapshot.ReadHeader(filepath.Join(s.path, e.Name()))
		if err != nil || h.Rank != r || h.Step != s.step {
			continue
		}
		if h.Replicated() {
			return true
		}
		ranks[h.World]++ // the header checks Rank < World
	}
	for world, n := range ranks {
		if n == world {
			return true
		}
	}
	return false
}

// removeOwn deletes the files of p's ranks in the step directory dir, and
// dir when nothing else is left in it.
func (p *persister) removeOwn(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if p.owns(e.Name()) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("durable: %w", err))
			}
		}
	}
	err = os.Remove(dir)
	if err != nil && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("durable: %w", err))
	}
	return errors.Join(errs...)
}

// owns reports whether name, in a step directory, is a file of one of p's
// ranks or a temporary copy of one.
func (p *persister) owns(name string) bool {
	if r, ok := parseSlotName(name); ok {
		return p.own[r]
	}
	for _, r := range p.ranks {
		if isTmpOf(name, r) {
			return true
		}
	}
	return false
}
