package testutil

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// OnRanks runs f(rank) for every rank in [0, size) at once, each in its own
// goroutine (one in-process rank of a comm.World, a trainer or a
// checkpoint group), and returns the errors by rank once every f has
// returned.
func OnRanks(size int, f func(rank int) error) []error {
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() { errs[r] = f(r) })
	}
	wg.Wait()
	return errs
}

// RequireRanks fails t at the first rank whose error is not nil, naming
// the rank.
func RequireRanks(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}
