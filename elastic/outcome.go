package elastic

import (
	"fmt"
	"syscall"
	"time"

	"github.com/gorun/gorun/rendezvous"
)

// outcome is how one pass of the agent's life came out, as exactly one of
// the values below; Agent.rounds acts on it through decide.
//
// roundMonitor.run returns how this node's part of a round ended:
// succeeded, failed, respawn, reform, ended, requeue or stopped. The
// agent settles the first three with the rendezvous (Agent.settle), which
// says how the round ends for the job: rejoin (a next round) or closed.
// Waiting for a round ends in rejoin's absence with stopped, requeue,
// closed, leftOut, evicted or broken.
type outcome interface{ isOutcome() }

// succeeded: every worker here succeeded.
type succeeded struct{}

// failed: workers here failed, and every other worker here was stopped.
type failed struct{ failures []rendezvous.Failure }

// respawn: one worker here failed and is restarted alone in the next
// round, the others kept in place (keep, of kind keepRespawn, which names
// it).
type respawn struct {
	failure rendezvous.Failure
	keep    *keep
}

// reform: the round ended elsewhere for a membership change, and the
// workers here go on into the next round in place (keep, keepMembership).
type reform struct {
	end  rendezvous.End
	keep *keep
}

// ended: the round ended elsewhere, and the workers here were stopped.
type ended struct{ end rendezvous.End }

// requeue: the workers checkpointed on request (SIGUSR1/SIGUSR2, SLURM's
// warning) and stopped; or, with idle set, that signal came while this
// node waited for a round with no workers to checkpoint.
type requeue struct{ idle syscall.Signal }

// stopped: a stop signal (or the job's context ending) stopped the node.
type stopped struct{ sig syscall.Signal }

// rejoin: the round is over for the job and a next one opens; keep, when
// not nil, goes on into it in place. afterFailure: workers here failed,
// so the restart is paced (restartPacer).
type rejoin struct {
	end          rendezvous.End
	keep         *keep
	afterFailure bool
}

// closed: the job closed (succeeded, or failed on any node).
type closed struct{ end rendezvous.End }

// leftOut: the job succeeded while this node waited to join a round.
type leftOut struct{ err *rendezvous.ClosedError }

// evicted: the job goes on without this node.
type evicted struct{ reason string }

// broken: the agent itself cannot go on (a worker could not be started,
// the rendezvous failed, an illegal state edge).
type broken struct{ err error }

func (succeeded) isOutcome() {}
func (failed) isOutcome()    {}
func (respawn) isOutcome()   {}
func (reform) isOutcome()    {}
func (ended) isOutcome()     {}
func (requeue) isOutcome()   {}
func (stopped) isOutcome()   {}
func (rejoin) isOutcome()    {}
func (closed) isOutcome()    {}
func (leftOut) isOutcome()   {}
func (evicted) isOutcome()   {}
func (broken) isOutcome()    {}

// keepKind is why workers go on into the next round in place.
type keepKind int

const (
	// keepMembership: the round ended for a membership change (a node lost
	// or joining, or a re-form): every worker here goes on.
	keepMembership keepKind = iota
	// keepRespawn: one worker here failed; it is restarted alone (replace)
	// and the others go on.
	keepRespawn
	// keepSpare: a hot spare's workers, started before this node had a
	// round (Agent.standby); they ran none, so taking them in is no
	// recovery of this node's.
	keepSpare
)

func (k keepKind) String() string {
	switch k {
	case keepMembership:
		return "membership"
	case keepRespawn:
		return "respawn"
	case keepSpare:
		return "spare"
	}
	return fmt.Sprintf("keepKind(%d)", int(k))
}

// keep is workers that go on into the next round in place, on their way
// there: the one value that carries them from the round that kept them
// (or from standby) to adopt.
type keep struct {
	kind    keepKind
	workers []*worker // the live workers kept, in local-rank order
	replace []int     // local ranks that start fresh in the next round (keepRespawn: the failed one)
	end     rendezvous.End
	// endedAt is when this node's first worker saw its world break, else
	// when this node saw the round end: the recovery is timed from it.
	endedAt  time.Time
	lastStep int // the last step its workers reported before, -1: none
}

// atBoundary says whether the kept workers go into the next round at a
// step boundary their intact world agrees on (only nodes join): then no
// worker can be replaced.
func (k *keep) atBoundary() bool { return k.end.Grow }

// keptAcross says whether a round that ended with end keeps live workers
// in place: a membership change, or a worker failure whose agent restarts
// that worker alone.
func keptAcross(end rendezvous.End) bool {
	return !end.Closed && (end.Cause == rendezvous.CauseMembership || end.Cause == rendezvous.CauseFailure && end.InPlace)
}

// decide is the agent's next state after a pass that came out as out,
// from state s: Rendezvous for a next round, else Succeeded or Failed,
// where the agent's life ends. It is pure. It refuses, with an error the
// caller acts on, an outcome the agent must settle first (a round's own,
// see Agent.settle) and an edge that is not in the transition table
// (such as a second end of an agent that ended): both are bugs.
func decide(s State, out outcome) (State, error) {
	var to State
	switch o := out.(type) {
	case rejoin:
		to = StateRendezvous
	case closed:
		to = StateFailed
		if o.end.Result == rendezvous.ResultSucceeded {
			to = StateSucceeded
		}
	case stopped, requeue, leftOut, evicted, broken:
		to = StateFailed
	case nil:
		return s, fmt.Errorf("elastic: no outcome in state %s", s)
	default:
		return s, fmt.Errorf("elastic: outcome %T in state %s is not settled with the rendezvous", out, s)
	}
	if err := checkTransition(s, to); err != nil {
		return s, fmt.Errorf("%w (after %T)", err, out)
	}
	return to, nil
}
