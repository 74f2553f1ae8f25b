package elastic

// State is where the agent is in its life.
type State int

// The agent's states. Init -> Rendezvous -> Running, then Succeeded, or
// Stopping -> Rendezvous (restart) or Failed.
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
