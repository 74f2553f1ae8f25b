package elastic

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/rendezvous"
)

// recorder is an Observer that writes down what it is told.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf(format, args...))
}

func (r *recorder) StateChanged(from, to State) { r.add("state %s->%s", from, to) }
func (r *recorder) RoundStarted(round rendezvous.Round, _ time.Duration) {
	r.add("round %d nodes %d", round.Number, round.NumNodes)
}
func (r *recorder) Restarted(cause RestartCause, lost int) { r.add("restart %s lost %d", cause, lost) }
func (r *recorder) WorkerStarted(w distenv.Worker)         { r.add("start rank %d", w.Rank) }
func (r *recorder) RecoveredInPlace(round rendezvous.Round, _ int) {
	r.add("in place round %d nodes %d", round.Number, round.NumNodes)
}
func (r *recorder) WorkerProgress(w distenv.Worker, p heartbeat.Progress) {
	r.add("progress rank %d: %s", w.Rank, p.Line())
}
func (r *recorder) WorkerExited(w distenv.Worker, code int) {
	r.add("exit rank %d code %d", w.Rank, code)
}
func (r *recorder) RoundEnded(end rendezvous.End) { r.add("ended: %s", end.Reason) }
func (r *recorder) WorkersStarted(warm, fresh int) {
	r.add("started warm %d fresh %d", warm, fresh)
}

// count is how many events are ev.
func (r *recorder) count(ev string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e == ev {
			n++
		}
	}
	return n
}

func (r *recorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// TestObserverSeesTheJob: a worker failure, its restart and the round
// that succeeds reach the observer, with exit codes and states.
func TestObserverSeesTheJob(t *testing.T) {
	h := newHarness(t, "flaky:1", 2)
	h.spec.MaxRestarts = 1
	rec := &recorder{}
	h.spec.Observer = rec
	out, _ := h.run(t)
	require.Equal(t, 0, out.ExitCode)
	events := rec.all()
	for ev, n := range map[string]int{
		"round 0 nodes 1": 1, "round 1 nodes 1": 1,
		"restart worker_failure lost 0": 1,
		"start rank 0":                  2, "start rank 1": 2,
		"exit rank 0 code 5": 1, "exit rank 0 code 0": 1,
		"state running->stopping":   1,
		"state rendezvous->running": 2,
		"state running->succeeded":  1,
		"ended: worker failure":     1,
		"started warm 0 fresh 2":    2,
	} {
		require.Equal(t, n, rec.count(ev), "%q in %q", ev, events)
	}
	require.Equal(t, "state init->rendezvous", events[0])
	// An EndObserver learns why the round ended before the next one forms.
	require.Less(t, slices.Index(events, "ended: worker failure"), slices.Index(events, "round 1 nodes 1"), "%q", events)
}

// TestObserverGetsHeartbeats: with an observer and no heartbeat timeout,
// the workers still get a heartbeat pipe, and what they report on it
// reaches the observer.
func TestObserverGetsHeartbeats(t *testing.T) {
	h := newHarness(t, "report-then-wait", 2)
	rec := &recorder{}
	h.spec.Observer = rec
	a, err := New(h.spec, &rendezvous.Static{Round: rendezvous.Round{NumNodes: 1, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 1}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan Outcome, 1)
	go func() {
		out, _ := a.Run(ctx)
		done <- out
	}()
	require.Eventually(t, func() bool {
		return rec.count("progress rank 0: 1 loss=2.5 tokens_per_s=100 mfu=0.5\n") == 1 &&
			rec.count("progress rank 1: 1 loss=2.5 tokens_per_s=100 mfu=0.5\n") == 1
	}, 20*time.Second, 10*time.Millisecond, "events: %q", rec.all())
	h.signals <- syscall.SIGTERM
	out := <-done
	require.Equal(t, 128+int(syscall.SIGTERM), out.ExitCode)
	require.Equal(t, 1, rec.count("exit rank 0 code 0"), "events: %q", rec.all())
}

func TestRestartOf(t *testing.T) {
	for _, tc := range []struct {
		name       string
		prev, next int // nodes
		cause      RestartCause
		lost       int
	}{
		{"same nodes: worker failure", 3, 3, RestartWorkerFailure, 0},
		{"fewer nodes: nodes lost", 4, 2, RestartMembershipChange, 2},
		{"more nodes: nodes joined", 2, 3, RestartMembershipChange, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cause, lost := restartOf(rendezvous.Round{NumNodes: tc.prev}, rendezvous.Round{NumNodes: tc.next})
			require.Equal(t, tc.cause, cause)
			require.Equal(t, tc.lost, lost)
		})
	}
}
