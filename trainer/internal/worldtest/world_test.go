package worldtest

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gorun/gorun/internal/distenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWorker(t *testing.T) {
	w := Rounds(t, "run", Shape{4, 2}, Shape{2, 1})
	require.NotEqual(t, w[0].Port, w[1].Port)
	require.Equal(t, distenv.Worker{Rank: 3, WorldSize: 4, LocalRank: 1, LocalWorldSize: 2, GroupRank: 1, GroupWorldSize: 2,
		MasterAddr: "127.0.0.1", MasterPort: w[0].Port, RunID: "run"}, w[0].Worker(3))
	require.Equal(t, distenv.Worker{Rank: 1, WorldSize: 2, LocalRank: 0, LocalWorldSize: 1, GroupRank: 1, GroupWorldSize: 2,
		MasterAddr: "127.0.0.1", MasterPort: w[1].Port, RunID: "run", RestartCount: 1}, w[1].Worker(1))
	for _, wk := range []distenv.Worker{w[0].Worker(0), w[0].Worker(3), w[1].Worker(1)} {
		require.NoError(t, wk.Validate())
	}
}

// closer counts its Close calls.
type closer struct {
	closed *atomic.Int32
	err    error
}

func (c closer) Close() error { c.closed.Add(1); return c.err }

func TestStartClosesWhatItMade(t *testing.T) {
	var closed atomic.Int32
	t.Run("every rank connects", func(t *testing.T) {
		conns := Start(t, New(t, "run", 3, 3), func(w distenv.Worker) (closer, error) { return closer{closed: &closed}, nil })
		require.Len(t, conns, 3)
		require.Zero(t, closed.Load(), "open until the test ends")
	})
	require.EqualValues(t, 3, closed.Load())

}

func TestRunReturnsErrorsByRank(t *testing.T) {
	errs := New(t, "run", 3, 1).Run(func(w distenv.Worker) error {
		if w.Rank == 1 {
			return errors.New("no")
		}
		return nil
	})
	require.NoError(t, errs[0])
	require.EqualError(t, errs[1], "no")
	require.NoError(t, errs[2])
}
