package comm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/heartbeat"
)

// hangGuard bounds a wait that only a bug makes long: it fails the test
// instead of hanging it. No assertion is about time.
const hangGuard = time.Minute

// events records what happened, in order, from any goroutine.
type events struct {
	mu   sync.Mutex
	list []string
}

func (e *events) add(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, fmt.Sprintf(format, args...))
}

func (e *events) get() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.list...)
}

// silentWorld is a world of three ranks where rank 2 is alive (its
// World answers heartbeats) but takes no part in collectives: the link
// from rank 1 is black-holed, as to a node cut off by a partition or a
// stopped process. No timeout can end a wait in it within the test
// (Timeout: 10 minutes): only an abort can.
func silentWorld(t *testing.T, tcpOnly bool) []*World {
	return startWorld(t, 3, func(c *Config) {
		c.Timeout = 10 * time.Minute
		c.TCPOnly = tcpOnly
	})
}

// inFlight returns once rank 1 has begun a collective on All: its header
// reached silent rank 2, which reads nothing more.
func inFlight(t *testing.T, silent *World) {
	var h [headerLen]byte
	_, err := io.ReadFull(silent.All().prev, h[:])
	require.NoError(t, err)
}

// result waits for a collective's error, failing the test past the hang
// guard.
func result(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(hangGuard):
		require.FailNow(t, "the collective did not return after the abort")
		return nil
	}
}

// An abort wakes a rank blocked in a collective with a peer that never
// answers: small (sequential) and large (pipelined, blocked in a write or
// waiting for shared-memory credits) all-reduces, over Unix sockets with
// shared memory and over TCP. The collective returns ErrAborted with the
// cause, after the abort and because of it (nothing else could end it).
func TestAbortUnblocksCollective(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n       int
		tcpOnly bool
	}{
		{"small", 1000, false},
		{"small tcp", 1000, true},
		{"large", 8 << 20, false},
		{"large tcp", 8 << 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			worlds := silentWorld(t, tc.tcpOnly)
			var ev events
			cause := errors.New("round 1 started")
			done := make([]chan error, 2)
			for r := range done {
				done[r] = make(chan error, 1)
				go func() {
					err := worlds[r].All().AllReduce(make([]float32, tc.n))
					ev.add("rank %d returned", r)
					done[r] <- err
				}()
			}
			inFlight(t, worlds[2])
			ev.add("rank 1 blocked")
			worlds[1].Abort(cause)
			err := result(t, done[1])
			worlds[0].Abort(cause)
			err0 := result(t, done[0])
			require.Equal(t, []string{"rank 1 blocked", "rank 1 returned", "rank 0 returned"}, ev.get())
			for _, err := range []error{err, err0} {
				require.ErrorIs(t, err, ErrAborted)
				require.ErrorIs(t, err, cause)
				var pe *PeerError
				require.False(t, errors.As(err, &pe), "an abort blames no peer: %v", err)
			}
			// Later collectives and groups fail alike, at once.
			require.ErrorIs(t, worlds[1].All().Barrier(), ErrAborted)
			_, gerr := worlds[1].Group([]int{1, 2})
			require.ErrorIs(t, gerr, ErrAborted)
		})
	}
}

// An abort wakes a rank that waits for a peer to join a new group.
func TestAbortUnblocksGroup(t *testing.T) {
	worlds := silentWorld(t, false)
	done := make(chan error, 1)
	go func() {
		_, err := worlds[0].Group([]int{0, 2}) // rank 2 never makes it
		done <- err
	}()
	worlds[0].Abort(nil)
	err := result(t, done)
	require.ErrorIs(t, err, ErrAborted)
}

// The agent's round line on the worker's channel (fd 3, here a real
// socket pair in this process) wakes a rank blocked in a collective with
// a silent peer: the Follower ends the training phase's context with
// heartbeat.ErrNewRound, the world aborts with that cause (as
// trainer.Run does), the collective returns, and Leave hands over the
// new contract. Asserted on the order of the events, not on time.
func TestRoundLineUnblocksCollective(t *testing.T) {
	worlds := silentWorld(t, false)
	pipe, err := heartbeat.NewPipe()
	require.NoError(t, err)
	fd, err := unix.Dup(int(pipe.WorkerEnd().Fd()))
	require.NoError(t, err)
	require.NoError(t, pipe.CloseWorkerEnd())
	beat := heartbeat.FromEnv(func(k string) (string, bool) { return strconv.Itoa(fd), k == heartbeat.EnvVar })
	require.NotNil(t, beat)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		_ = beat.Close()
		_ = pipe.Close()
	})

	var ev events
	follow := beat.Follow(ctx, func(from, to heartbeat.Phase, why string) { ev.add("%s->%s: %s", from, to, why) })
	phase, err := follow.Enter(ctx, heartbeat.Training)
	require.NoError(t, err)
	stop := context.AfterFunc(phase, func() { worlds[1].Abort(context.Cause(phase)) })
	defer stop()
	done := make(chan error, 1)
	go func() {
		err := worlds[1].All().AllReduce(make([]float32, 8<<20))
		ev.add("collective returned")
		done <- err
	}()
	inFlight(t, worlds[2])
	ev.add("blocked")
	next := distenv.Worker{Rank: 0, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 1, RestartCount: 1}
	ev.add("round line sent")
	require.NoError(t, pipe.SendRound(next, false))
	err = result(t, done)
	require.ErrorIs(t, err, ErrAborted)
	require.ErrorIs(t, err, heartbeat.ErrNewRound)
	got, lerr := follow.Leave()
	require.NoError(t, lerr)
	require.Equal(t, next, *got)
	require.Equal(t, []string{
		"idle->training: enter",
		"blocked",
		"round line sent",
		"training->training: phase ended: round 1 arrived",
		"collective returned",
		"training->idle: leave",
	}, ev.get())
	worlds[0].Abort(nil)
}
