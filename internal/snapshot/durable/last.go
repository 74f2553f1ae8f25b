package durable

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/internal/snapshot"
)

// PersistLast copies to dst every complete snapshot that the agent's
// snapshot directory src holds of the given global ranks, whatever its
// step (both slots of a rank: its newest step and the one before), as
// Persist copies a due step: atomically, CRC-checked, fsynced, a step dst
// holds already not copied again, a replicated state from rank 0's slots
// alone; then it keeps the newest keep complete steps as Persist does.
//
// It is for the end of an agent's life, once the workers are gone and
// their slots no longer change: a job stopped (scancel, the time limit, a
// preemption) or failed restarts from the newest step every rank saved,
// not from the last due step. Both slots, because ranks stopped one step
// apart still have a step in common there.
//
// It returns the snapshots it persisted or found persisted already,
// newest step first, and the errors of the slots it could not copy (each
// naming its file), joined; ctx ending stops it between chunks of a copy.
// An incomplete slot is no error: it holds nothing to keep.
func PersistLast(ctx context.Context, src string, ranks []int, dst string, keep int, log zerolog.Logger) ([]snapshot.Header, error) {
	p, err := newPersister(src, ranks, dst, 1, keep, log)
	if err != nil {
		return nil, err
	}
	if err := p.mkdirDst(); err != nil {
		return nil, err
	}
	var kept []snapshot.Header
	var errs []error
	for _, r := range ranks {
		for _, path := range snapshot.Paths(src, r) {
			h, err := snapshot.ReadHeader(path)
			if errors.Is(err, snapshot.ErrIncomplete) || errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				errs = append(errs, err)
				continue
			}
			s := snapshot.Slot{Header: h, Path: path}
			if _, err := p.persist(ctx, r, s); err != nil {
				errs = append(errs, fmt.Errorf("durable: the last copy of %s (step %d): %w", path, h.Step, err))
				continue
			}
			if hd, err := snapshot.ReadHeader(p.final(s)); err == nil && hd == h {
				kept = append(kept, h)
			}
		}
	}
	slices.SortFunc(kept, func(a, b snapshot.Header) int {
		return cmp.Or(cmp.Compare(b.Step, a.Step), cmp.Compare(a.Rank, b.Rank))
	})
	return kept, errors.Join(errs...)
}
