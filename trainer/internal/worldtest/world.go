package worldtest

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/testutil"
)

// Host is the address of every in-process world: rank 0's bootstrap store listens on it, and
// the ranks, which reach the store through it, listen on it for each other.
const Host = "127.0.0.1"

// World is one round of an in-process run: Size ranks, PerNode of them to a node, whose rank 0
// hosts the bootstrap store at Host:Port.
type World struct {
	Size    int    // WORLD_SIZE
	PerNode int    // LOCAL_WORLD_SIZE; it divides Size
	Port    int    // MASTER_PORT
	RunID   string // TORCHELASTIC_RUN_ID
	Round   int    // TORCHELASTIC_RESTART_COUNT
}

// Shape is the size of one round's world for Rounds: Size ranks, PerNode of them to a node.
type Shape struct{ Size, PerNode int }

// New returns round 0 of run runID: size ranks, perNode to a node, at a loopback port that was
// free a moment ago. It fails t when the kernel gives no port.
func New(t testing.TB, runID string, size, perNode int) World {
	t.Helper()
	return Rounds(t, runID, Shape{size, perNode})[0]
}

// Rounds returns the worlds of rounds 0, 1, ... of run runID, one of each shape, each at its
// own loopback port (distinct, and free a moment ago), for a test whose ranks go on from one
// world to the next. It fails t when the kernel gives no port.
func Rounds(t testing.TB, runID string, shapes ...Shape) []World {
	t.Helper()
	ports, err := testutil.FreePorts(len(shapes))
	if err != nil {
		t.Fatal(err)
	}
	worlds := make([]World, len(shapes))
	for i, s := range shapes {
		if s.Size < 1 || s.PerNode < 1 || s.Size%s.PerNode != 0 {
			t.Fatalf("worldtest: round %d: %d ranks, %d to a node", i, s.Size, s.PerNode)
		}
		worlds[i] = World{Size: s.Size, PerNode: s.PerNode, Port: ports[i], RunID: runID, Round: i}
	}
	return worlds
}

// Worker is the worker contract of rank in w: ranks fill the nodes in order, PerNode to each.
func (w World) Worker(rank int) distenv.Worker {
	return distenv.Worker{Rank: rank, WorldSize: w.Size, LocalRank: rank % w.PerNode, LocalWorldSize: w.PerNode,
		GroupRank: rank / w.PerNode, GroupWorldSize: w.Size / w.PerNode, MasterAddr: Host, MasterPort: w.Port,
		RunID: w.RunID, RestartCount: w.Round}
}

// Run calls f with the Worker of every rank of w at once, each in its own goroutine, and
// returns the errors by rank once every call has returned. f must not fail the test itself
// (it runs off the test goroutine): it returns what went wrong.
func (w World) Run(f func(worker distenv.Worker) error) []error {
	return testutil.OnRanks(w.Size, func(r int) error { return f(w.Worker(r)) })
}

// Start connects every rank of w at once: connect is called with each rank's Worker in its own
// goroutine and returns that rank's connection (a comm.World, typically). Start returns the
// connections by rank, or fails t naming the first rank whose connect failed. When t ends it
// closes every connection that was made, failed start or not, and fails t if a Close fails.
func Start[C io.Closer](t testing.TB, w World, connect func(worker distenv.Worker) (C, error)) []C {
	t.Helper()
	conns := make([]C, w.Size)
	made := make([]bool, w.Size)
	errs := w.Run(func(worker distenv.Worker) error {
		c, err := connect(worker)
		if err != nil {
			return err
		}
		conns[worker.Rank], made[worker.Rank] = c, true
		return nil
	})
	t.Cleanup(func() {
		var closeErrs []error
		for r, c := range conns {
			if made[r] {
				if err := c.Close(); err != nil {
					closeErrs = append(closeErrs, fmt.Errorf("rank %d: close: %w", r, err))
				}
			}
		}
		require.NoError(t, errors.Join(closeErrs...))
	})
	testutil.RequireRanks(t, errs)
	return conns
}
