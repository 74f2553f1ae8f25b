package elastic

import (
	"fmt"
	"slices"
	"sync/atomic"
)

// health is what the agent knows of one worker's well-being, as one
// value with legal moves (healthMoves), in place of a flag per fact:
//
//	healthy   -> resuming, hung, abandoned, judged, suspect
//	resuming  -> healthy, hung, abandoned, judged, suspect
//	hung      -> judged, suspect, abandoned
//	judged, suspect, abandoned: final for the worker
//
// healthy: nothing noted. resuming: kept in place into a new round, its
// first progress there not yet seen. hung: its heartbeats stopped
// (Spec.HeartbeatTimeout). judged: named the culprit of a hang and asked
// for a stack dump (SIGQUIT). suspect: named the culprit of a hang found
// stopped or stuck in the kernel, and killed. abandoned: it awaited a new
// round longer than Spec.AwaitTimeout. A hung worker is never kept in
// place or left running beside a worker restarted alone, so "resuming"
// needs no hung twin.
type health int32

const (
	healthy health = iota
	resuming
	hung
	judged
	suspect
	abandoned
)

func (h health) String() string {
	switch h {
	case healthy:
		return "healthy"
	case resuming:
		return "resuming"
	case hung:
		return "hung"
	case judged:
		return "judged"
	case suspect:
		return "suspect"
	case abandoned:
		return "abandoned"
	}
	return fmt.Sprintf("health(%d)", int32(h))
}

// stalled says whether the worker's heartbeats stopped (whether or not it
// was judged for it yet).
func (h health) stalled() bool { return h == hung || h == judged || h == suspect }

// healthMoves are the legal moves between health values, from -> to.
var healthMoves = map[health][]health{
	healthy:  {resuming, hung, abandoned, judged, suspect},
	resuming: {healthy, hung, abandoned, judged, suspect},
	hung:     {judged, suspect, abandoned},
}

// canMove says whether from -> to is a legal move of a worker's health.
func canMove(from, to health) bool {
	return slices.Contains(healthMoves[from], to)
}

// healthCell holds a worker's health for the goroutines that read and
// move it (the round's monitor, the worker's heartbeat reader and stall
// watcher).
type healthCell struct{ v atomic.Int32 }

func (c *healthCell) load() health { return health(c.v.Load()) }

// mark moves the health from `from` to `to` and reports whether it did:
// it refuses a move that is not in healthMoves, and one whose worker is
// no longer at `from` (another goroutine moved it first).
func (c *healthCell) mark(from, to health) bool {
	return canMove(from, to) && c.v.CompareAndSwap(int32(from), int32(to))
}

// markFrom moves the health to `to` from whichever of froms it is at,
// and reports whether it did.
func (c *healthCell) markFrom(to health, froms ...health) bool {
	for {
		h := c.load()
		if !slices.Contains(froms, h) {
			return false
		}
		if c.mark(h, to) {
			return true
		}
		if !canMove(h, to) {
			return false
		}
	}
}
