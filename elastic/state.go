package elastic

import "fmt"

// State is where the agent is in its life.
type State int

// The agent's states. Init -> Rendezvous -> Running, then Succeeded, or
// Stopping -> Rendezvous (restart) or Failed, or Reforming -> Rendezvous
// (workers kept in place into the next round); transitions lists every
// edge, Agent.transition refuses any other, and decide picks the edge
// after each pass of the agent's life from how it came out.
const (
	StateInit State = iota
	StateRendezvous
	StateRunning
	StateStopping
	StateSucceeded
	StateFailed
	// StateReforming: the round is over and this node's live workers run
	// on, in place, into the next (a membership change: reform; or one of
	// them restarted alone: respawn).
	StateReforming
)

func (s State) String() string {
	switch s {
	case StateInit:
		return "init"
	case StateRendezvous:
		return "rendezvous"
	case StateRunning:
		return "running"
	case StateStopping:
		return "stopping"
	case StateSucceeded:
		return "succeeded"
	case StateFailed:
		return "failed"
	case StateReforming:
		return "reforming"
	}
	return "unknown"
}

// transitions are the agent's allowed edges, from -> to.
var transitions = map[State][]State{
	StateInit: {StateRendezvous, StateFailed},
	// A round runs; the job closed (or a signal came) while waiting.
	StateRendezvous: {StateRunning, StateSucceeded, StateFailed},
	// Workers stop for a reason; they all succeeded and the job closed or
	// a new round opened; the agent itself failed; the round ended for a
	// membership change and the workers are kept (in place).
	StateRunning:  {StateStopping, StateSucceeded, StateRendezvous, StateFailed, StateReforming},
	StateStopping: {StateRendezvous, StateSucceeded, StateFailed},
	// The kept workers' next round: rejoin. (The job closing or a stop
	// signal is seen in the rendezvous, which stops them.) A worker
	// restarted alone whose failure spent the restart budget: the job
	// closed as failed.
	StateReforming: {StateRendezvous, StateFailed},
}

// checkTransition reports an edge the agent must never take: a bug.
func checkTransition(from, to State) error {
	for _, s := range transitions[from] {
		if s == to {
			return nil
		}
	}
	return fmt.Errorf("elastic: agent state %s -> %s is not an allowed transition", from, to)
}
