package heartbeat

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gorun/gorun/internal/distenv"
)

// phaseLog records a Follower's phase changes in order.
type phaseLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *phaseLog) add(from, to Phase, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf("%s->%s: %s", from, to, why))
}

func (l *phaseLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

func contract(round int) distenv.Worker {
	return distenv.Worker{Rank: 1, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 1, RestartCount: round}
}

// A contract that arrives while the worker trains ends the phase's
// context with ErrNewRound, and Leave hands it over.
func TestFollowerTrainingEndsOnRound(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	p, b := inProcess(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var log phaseLog
	f := b.Follow(ctx, log.add)

	pctx, err := f.Enter(ctx, Training)
	require.NoError(t, err)
	require.Equal(t, Training, f.Phase())
	require.NoError(t, p.SendRound(contract(1), false))
	<-pctx.Done() // the test's own timeout is the hang guard
	require.ErrorIs(t, context.Cause(pctx), ErrNewRound)
	require.Equal(t, Training, f.Phase(), "the phase lasts until Leave")
	w, err := f.Leave()
	require.NoError(t, err)
	require.Equal(t, contract(1), *w)
	require.Equal(t, Idle, f.Phase())
	require.Equal(t, []string{
		"idle->training: enter",
		"training->training: phase ended: round 1 arrived",
		"training->idle: leave",
	}, log.get())

	// Without a contract, Leave hands over nothing and ends the context
	// with context.Canceled.
	pctx, err = f.Enter(ctx, Reforming)
	require.NoError(t, err)
	w, err = f.Leave()
	require.NoError(t, err)
	require.Nil(t, w)
	require.ErrorIs(t, context.Cause(pctx), context.Canceled)
	cancel()
}

// A contract that arrived between phases makes the next phase start
// ended, and Await takes one pending at once or waits for the next; the
// newest round wins; the agent's end closing ends Await.
func TestFollowerIdleAndAwait(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	p, b := inProcess(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := b.Follow(ctx, nil)

	require.NoError(t, p.SendRound(contract(2), false))
	got, err := f.Await(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, contract(2), got)
	require.Equal(t, Idle, f.Phase())

	require.NoError(t, p.SendRound(contract(3), false))
	require.NoError(t, p.SendRound(contract(4), false))
	// Both lines are read before Await can miss one: take them in order.
	got, err = f.Await(ctx, nil)
	require.NoError(t, err)
	if got.RestartCount == 3 { // read between the two lines
		got, err = f.Await(ctx, nil)
		require.NoError(t, err)
	}
	require.Equal(t, contract(4), got)

	require.NoError(t, p.SendRound(contract(5), false))
	got, err = f.Await(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 5, got.RestartCount)
	require.NoError(t, p.SendRound(contract(6), false))
	waitPending(f, 6)
	pctx, err := f.Enter(ctx, Training)
	require.NoError(t, err)
	require.ErrorIs(t, context.Cause(pctx), ErrNewRound, "born ended: round 6 arrived before")
	w, err := f.Leave()
	require.NoError(t, err)
	require.Equal(t, 6, w.RestartCount)

	stop := make(chan struct{})
	close(stop)
	_, err = f.Await(ctx, stop)
	require.ErrorContains(t, err, "stopped while awaiting")

	require.NoError(t, p.Close())
	_, err = f.Await(ctx, nil)
	require.ErrorIs(t, err, ErrAgentGone)
	cancel()
}

// Edges outside the machine are refused and change nothing.
func TestFollowerRefusesEdges(t *testing.T) {
	f := (*Beater)(nil).Follow(context.Background(), nil)
	_, err := f.Leave()
	require.ErrorContains(t, err, "leave: the worker is idle")
	_, err = f.Enter(context.Background(), Awaiting)
	require.Error(t, err)
	_, err = f.Enter(context.Background(), Training)
	require.NoError(t, err)
	_, err = f.Enter(context.Background(), Reforming)
	require.ErrorContains(t, err, "idle -> reforming refused: the worker is training")
	_, err = f.Await(context.Background(), nil)
	require.ErrorContains(t, err, "refused")
	require.Equal(t, Training, f.Phase())
	_, err = f.Leave()
	require.NoError(t, err)
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(fmt.Errorf("test over"))
	_, err = f.Await(ctx, nil) // a nil Beater's Follower never gets a contract
	require.ErrorContains(t, err, "test over")
}

// waitPending returns once f holds round's contract, woken by each
// arrival (the test's timeout is the hang guard).
func waitPending(f *Follower, round int) {
	for {
		f.mu.Lock()
		arrived, have := f.arrived.Changed(), f.pending != nil && f.pending.RestartCount == round
		f.mu.Unlock()
		if have {
			return
		}
		<-arrived
	}
}

// Keep puts a contract back between phases: the next phase starts ended
// with it; out of Idle it is refused.
func TestFollowerKeep(t *testing.T) {
	f := (*Beater)(nil).Follow(context.Background(), nil)
	require.NoError(t, f.Keep(contract(3)))
	pctx, err := f.Enter(context.Background(), Reforming)
	require.NoError(t, err)
	require.ErrorIs(t, context.Cause(pctx), ErrNewRound)
	require.ErrorContains(t, f.Keep(contract(4)), "the worker is reforming")
	w, err := f.Leave()
	require.NoError(t, err)
	require.Equal(t, contract(3), *w)
}

// A next line (the worker's world is intact: nodes only join) leaves a
// Training phase running: StopAsked says so until Leave hands the
// contract over. In Reforming it ends the phase as a round line does,
// and a round line that follows it ends Training at once.
func TestFollowerNextWaitsForAStepBoundary(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	p, b := inProcess(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var log phaseLog
	f := b.Follow(ctx, log.add)

	pctx, err := f.Enter(ctx, Training)
	require.NoError(t, err)
	require.False(t, f.StopAsked())
	require.NoError(t, p.SendRound(contract(1), true))
	require.Eventually(t, f.StopAsked, hangGuardFollow, time.Millisecond, "the next line reaches the follower")
	require.NoError(t, pctx.Err(), "the phase goes on to a step boundary")
	w, err := f.Leave()
	require.NoError(t, err)
	require.Equal(t, contract(1), *w)
	require.False(t, f.StopAsked(), "taken")

	// A round line after a next line: the world is over after all.
	pctx, err = f.Enter(ctx, Training)
	require.NoError(t, err)
	require.NoError(t, p.SendRound(contract(2), true))
	require.Eventually(t, f.StopAsked, hangGuardFollow, time.Millisecond)
	require.NoError(t, p.SendRound(contract(3), false))
	<-pctx.Done()
	require.ErrorIs(t, context.Cause(pctx), ErrNewRound)
	require.False(t, f.StopAsked())
	w, err = f.Leave()
	require.NoError(t, err)
	require.Equal(t, contract(3), *w)

	// In Reforming a next line ends the phase: that world will never be whole.
	pctx, err = f.Enter(ctx, Reforming)
	require.NoError(t, err)
	require.NoError(t, p.SendRound(contract(4), true))
	<-pctx.Done()
	require.ErrorIs(t, context.Cause(pctx), ErrNewRound)
	_, err = f.Leave()
	require.NoError(t, err)
}

// hangGuardFollow bounds a wait that only a bug makes long.
const hangGuardFollow = time.Minute
