package elastic

import "fmt"

// State is where the agent is in its life.
type State int

// The agent's states. Init -> Rendezvous -> Running, then Succeeded, or
// Stopping -> Rendezvous (restart) or Failed; transitions lists every
// edge.
const (
	StateInit State = iota
	StateRendezvous
	StateRunning
	StateStopping
	StateSucceeded
	StateFailed
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
	}
	return "unknown"
}

// transitions are the agent's allowed edges, from -> to.
var transitions = map[State][]State{
	StateInit: {StateRendezvous, StateFailed},
	// A round runs; the job closed (or a signal came) while waiting.
	StateRendezvous: {StateRunning, StateSucceeded, StateFailed},
	// Workers stop for a reason; they all succeeded and the job closed or
	// a new round opened; the agent itself failed.
	StateRunning:  {StateStopping, StateSucceeded, StateRendezvous, StateFailed},
	StateStopping: {StateRendezvous, StateSucceeded, StateFailed},
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
