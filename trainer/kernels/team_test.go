package kernels

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTeamRunsEveryPartOnce runs regions back to back, with pauses that let the workers park
// and exit, from concurrent callers and from inside a part: every part of every region runs
// exactly once, on its own goroutine, before run returns.
func TestTeamRunsEveryPartOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		threads int
		pause   time.Duration // between regions: 0 keeps workers spinning
		callers int
		nested  bool
	}{
		{name: "back to back", threads: 2, callers: 1},
		{name: "four threads", threads: 4, callers: 1},
		{name: "parked and gone", threads: 3, pause: parkedFor + spinFor, callers: 1},
		{name: "parking", threads: 2, pause: spinFor, callers: 1},
		{name: "concurrent callers", threads: 3, callers: 4},
		{name: "nested", threads: 2, callers: 1, nested: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tm := newTeam(tc.threads)
			regions := 200
			if tc.pause > 0 {
				regions = 5
			}
			var wg sync.WaitGroup
			for range tc.callers {
				wg.Go(func() {
					for range regions {
						for parts := 1; parts <= tc.threads; parts++ {
							counts := make([]atomic.Int32, parts)
							tm.run(parts, func(g int) {
								counts[g].Add(1)
								if tc.nested {
									inner := make([]atomic.Int32, parts)
									tm.run(parts, func(h int) { inner[h].Add(1) })
									for h := range inner {
										require.EqualValues(t, 1, inner[h].Load())
									}
								}
							})
							for g := range counts {
								require.EqualValues(t, 1, counts[g].Load(), "part %d of %d", g, parts)
							}
						}
						time.Sleep(tc.pause)
					}
				})
			}
			wg.Wait()
		})
	}
}

// TestForEachRunsEveryItemOnce runs each item exactly once for any number of items and threads.
func TestForEachRunsEveryItemOnce(t *testing.T) {
	for _, threads := range []int{1, 2, 3} {
		e := New(threads)
		for _, items := range []int{0, 1, 2, 5, 64} {
			seen := make([]int, items)
			for i := range seen {
				seen[i] = -1
			}
			var mu sync.Mutex
			e.ForEach(items, func(i int) {
				mu.Lock()
				defer mu.Unlock()
				seen[i]++
			})
			for i := range seen {
				require.Equal(t, 0, seen[i], "item %d of %d on %d threads", i, items, threads)
			}
		}
	}
}

// TestIdleTeamLetsGoOfItsGoroutines checks that a team nobody uses ends its workers' goroutines
// by itself (parked for parkedFor, then gone), so an Engine needs no Close.
func TestIdleTeamLetsGoOfItsGoroutines(t *testing.T) {
	tm := newTeam(3)
	tm.run(3, func(int) {})
	require.Eventually(t, func() bool {
		for i := range tm.workers {
			if tm.workers[i].state.Load() != workerGone {
				return false
			}
		}
		return true
	}, 30*time.Second, time.Millisecond)
}
