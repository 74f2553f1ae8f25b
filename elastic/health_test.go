package elastic

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHealthMoves: a worker's health moves only along healthMoves, and
// mark moves it only from the value it is at.
func TestHealthMoves(t *testing.T) {
	all := []health{healthy, resuming, hung, judged, suspect, abandoned}
	legal := map[[2]health]bool{}
	for from, tos := range map[health][]health{
		healthy:  {resuming, hung, abandoned, judged, suspect},
		resuming: {healthy, hung, abandoned, judged, suspect},
		hung:     {judged, suspect, abandoned},
	} {
		for _, to := range tos {
			legal[[2]health{from, to}] = true
		}
	}
	for _, from := range all {
		for _, to := range all {
			t.Run(from.String()+"->"+to.String(), func(t *testing.T) {
				var c healthCell
				c.v.Store(int32(from))
				require.Equal(t, legal[[2]health{from, to}], c.mark(from, to))
				if !legal[[2]health{from, to}] {
					require.Equal(t, from, c.load(), "a refused move leaves it")
				}
			})
		}
	}
}

// TestHealthMark: mark is a compare-and-swap: of two goroutines that mark
// a hung worker, one judged and one suspect, exactly one wins; markFrom
// refuses a worker that is not at one of the values it names.
func TestHealthMark(t *testing.T) {
	var c healthCell
	require.True(t, c.mark(healthy, resuming))
	require.False(t, c.mark(healthy, hung), "no longer healthy")
	require.True(t, c.markFrom(hung, healthy, resuming))
	var wg sync.WaitGroup
	won := make(chan health, 2)
	for _, to := range []health{judged, suspect} {
		wg.Go(func() {
			if c.markFrom(to, healthy, resuming, hung) {
				won <- to
			}
		})
	}
	wg.Wait()
	close(won)
	var winners []health
	for h := range won {
		winners = append(winners, h)
	}
	require.Len(t, winners, 1)
	require.Equal(t, winners[0], c.load())
	require.False(t, c.markFrom(abandoned, healthy, resuming, hung), "a judged worker is not abandoned")
	require.True(t, c.load().stalled())
}
