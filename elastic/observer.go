package elastic

import (
	"time"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/rendezvous"
)

// Observer is told what the agent does, e.g. to export it as metrics.
// The agent calls it from several goroutines (its round loop, one
// watcher per worker), so an Observer must be safe for concurrent use,
// and it must return at once: the agent waits for it.
type Observer interface {
	// StateChanged: the agent moved from one state to another.
	StateChanged(from, to State)
	// RoundStarted: round r runs on this node; formed is how long this
	// node waited in the rendezvous for it.
	RoundStarted(r rendezvous.Round, formed time.Duration)
	// Restarted: a round replaced the one this node ran before, for
	// cause; nodesLost is how many fewer nodes it has (0 when none).
	Restarted(cause RestartCause, nodesLost int)
	// RecoveredInPlace: round r took over this node's workers from the
	// round before, in place: no restart (Spec.InPlace).
	RecoveredInPlace(r rendezvous.Round, nodesLost int)
	// WorkerStarted: worker w of the current round started, or was kept
	// into it in place (w is then its new contract).
	WorkerStarted(w distenv.Worker)
	// WorkerProgress: worker w sent a heartbeat.
	WorkerProgress(w distenv.Worker, p heartbeat.Progress)
	// WorkerExited: worker w ended with exitCode (128+N for signal N).
	WorkerExited(w distenv.Worker, exitCode int)
}

// EndObserver is an Observer that is also told why each round this node
// ran ended (not for the job's end), before the next round forms: the
// agent calls RoundEnded when its Spec.Observer implements it.
type EndObserver interface {
	RoundEnded(end rendezvous.End)
}

// StartObserver is an Observer that is also told, for each round whose
// workers the agent started (not kept in place), how many were warm
// workers made that round's (Spec.Warm: an interpreter started ahead of
// the round) and how many fresh processes: the agent calls WorkersStarted
// when its Spec.Observer implements it.
type StartObserver interface {
	WorkersStarted(warm, fresh int)
}

// RestartCause is why a new round replaced the one before.
type RestartCause int

// The causes of a restart, as this node sees them: a round with as many
// nodes as the one before follows worker failures (here or on another
// node); one with fewer or more nodes follows a membership change (nodes
// lost or joining). A node replaced by another in the same restart counts
// as a worker failure.
const (
	RestartWorkerFailure RestartCause = iota
	RestartMembershipChange
)

func (c RestartCause) String() string {
	switch c {
	case RestartWorkerFailure:
		return "worker_failure"
	case RestartMembershipChange:
		return "membership_change"
	}
	return "unknown"
}

// restartOf is the cause of round next following round prev on this
// node, and how many nodes it lost.
func restartOf(prev, next rendezvous.Round) (RestartCause, int) {
	if next.NumNodes == prev.NumNodes {
		return RestartWorkerFailure, 0
	}
	return RestartMembershipChange, max(0, prev.NumNodes-next.NumNodes)
}

// nopObserver is the Observer of an agent given none.
type nopObserver struct{}

func (nopObserver) StateChanged(State, State)                         {}
func (nopObserver) RoundStarted(rendezvous.Round, time.Duration)      {}
func (nopObserver) Restarted(RestartCause, int)                       {}
func (nopObserver) RecoveredInPlace(rendezvous.Round, int)            {}
func (nopObserver) WorkerStarted(distenv.Worker)                      {}
func (nopObserver) WorkerProgress(distenv.Worker, heartbeat.Progress) {}
func (nopObserver) WorkerExited(distenv.Worker, int)                  {}
