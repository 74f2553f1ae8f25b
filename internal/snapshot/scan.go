package snapshot

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sync/errgroup"
)

// Holding is one complete snapshot in some node's directory: whose it is,
// at which step, and whether any rank may restore it. It travels as JSON
// in an Offer; Path, local to the node that scanned it, does not.
type Holding struct {
	Rank       int    // the global rank that saved it (its file name's rank)
	World      int    // the world size it was saved in
	Step       uint64 // the step it holds
	Replicated bool   // FlagReplicated: any rank of any world may restore it
	Path       string `json:"-"`
}

// Scan verifies every slot file named rank-<rank>.slot<0|1> in dir (as
// many at once as there are cores) and returns a Holding for each complete
// one, ordered by rank, then step, then path. Incomplete and corrupt slots, and slots whose header names another
// rank than their file name, are left out (they hold nothing restorable);
// other files are ignored. It returns an error naming the path when dir or
// a slot cannot be read.
func Scan(dir string) ([]Holding, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("snapshot: scan: %w", err)
	}
	type found struct {
		h  Holding
		ok bool
	}
	var slots []string
	for _, e := range entries {
		if _, ok := slotRank(e.Name()); ok && e.Type().IsRegular() {
			slots = append(slots, e.Name())
		}
	}
	// The slots are verified side by side, one per core: a round's workers
	// wait for the scan.
	results := make([]found, len(slots))
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i, name := range slots {
		g.Go(func() error {
			rank, _ := slotRank(name)
			s, err := Verify(filepath.Join(dir, name))
			if errors.Is(err, ErrIncomplete) || errors.Is(err, ErrCorrupt) || (err == nil && s.Rank != rank) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("snapshot: scan: %w", err)
			}
			results[i] = found{Holding{Rank: s.Rank, World: s.World, Step: s.Step, Replicated: s.Replicated(), Path: s.Path}, true}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var out []Holding
	for _, r := range results {
		if r.ok {
			out = append(out, r.h)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Rank != b.Rank {
			return a.Rank < b.Rank
		}
		if a.Step != b.Step {
			return a.Step < b.Step
		}
		return a.Path < b.Path
	})
	return out, nil
}

// slotRank returns the rank of a slot file's name, rank-<rank>.slot0 or
// .slot1 with rank in plain decimal, and whether name is one.
func slotRank(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "rank-")
	if !ok {
		return 0, false
	}
	num, ok := strings.CutSuffix(rest, ".slot0")
	if !ok {
		num, ok = strings.CutSuffix(rest, ".slot1")
	}
	if !ok || num == "" || (len(num) > 1 && num[0] == '0') || strings.TrimLeft(num, "0123456789") != "" {
		return 0, false
	}
	rank, err := strconv.Atoi(num)
	return rank, err == nil
}
