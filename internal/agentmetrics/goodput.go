package agentmetrics

import (
	"math"
	"slices"
	"sync"
	"time"
)

// Causes of lost time, the values of gorun_time_lost_seconds_total's cause label.
const (
	causeWorkerFailure    = "worker_failure"    // a restart after worker failures
	causeMembershipChange = "membership_change" // a restart after nodes were lost or joined
	causeInPlace          = "in_place"          // a membership change recovered in place
	causeUnknown          = "unknown"           // the agent left its round and no round followed yet
)

// Phases of a recovery, the values of gorun_time_lost_seconds_total's phase label.
const (
	// phaseDetection: from the last step before the recovery to the agent leaving its round.
	phaseDetection = "detection"
	// phaseRendezvous: from there to the next round formed on this node.
	phaseRendezvous = "rendezvous"
	// phaseFirstStep: from the round formed to the first step after it: the workers' start
	// or re-forming, their state transfer or checkpoint load, and that step.
	phaseFirstStep = "first_step"
	// phaseRedone: the steps the recovery threw away, at the median step time.
	phaseRedone = "redone_steps"
)

var (
	lossCauses = []string{causeWorkerFailure, causeMembershipChange, causeInPlace}
	lossPhases = []string{phaseDetection, phaseRendezvous, phaseFirstStep, phaseRedone}
)

// stepWindow is how many of the latest step times the median step time is taken over.
const stepWindow = 16

// goodput is the time this node's workers spent on steps the job kept, against the time since
// their first step, and the time lost to each recovery, by cause and phase. It follows one
// worker (the lowest local rank that reports steps: every rank of a world makes the same
// steps) and the agent's events; nothing is lost across rounds that this node ran in. It is
// safe for concurrent use.
type goodput struct {
	mu  sync.Mutex
	now func() time.Time
	// lost is called with each recovery's time by cause and phase as it ends.
	lost func(cause, phase string, seconds float64)

	first, last time.Time // the first step, and the latest of the current stretch
	localRank   int       // the local rank followed
	steps       time.Duration
	redone      time.Duration
	recent      []time.Duration // the latest stepWindow step times
	stall       *stall          // the recovery under way, nil when training
}

// stall is one recovery as this node sees it.
type stall struct {
	cause          string
	left, formedAt time.Time // the agent left its round; the next one formed (zero: not yet)
}

func newGoodput(now func() time.Time, lost func(cause, phase string, seconds float64)) *goodput {
	return &goodput{now: now, lost: lost, localRank: -1}
}

// leftRound: the agent left the round it trained in (not for the job's end).
func (g *goodput) leftRound() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.first.IsZero() || g.stall != nil {
		return
	}
	g.stall = &stall{cause: causeUnknown, left: g.now()}
}

// roundFormed: a round formed on this node, for cause (the round after a recovery).
func (g *goodput) roundFormed(cause string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stall == nil {
		if g.first.IsZero() {
			return
		}
		// No state change was seen (an in-place round may form while the agent stays in a
		// state that trains): the recovery began at the last step.
		g.stall = &stall{left: g.last}
	}
	g.stall.cause, g.stall.formedAt = cause, g.now()
}

// step: the worker of localRank finished step; redone is the steps its recovery threw away
// (NaN or 0 when none, or not reported).
func (g *goodput) step(localRank int, redone float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if g.localRank < 0 || localRank < g.localRank {
		g.localRank = localRank
	}
	if localRank != g.localRank {
		return
	}
	switch {
	case g.first.IsZero():
		g.first = now
	case g.stall != nil:
		g.endStall(now, redone)
	default:
		d := now.Sub(g.last)
		g.steps += d
		g.recent = append(g.recent, d)
		if len(g.recent) > stepWindow {
			g.recent = g.recent[1:]
		}
	}
	g.last = now
}

// endStall closes the recovery under way at the first step after it.
func (g *goodput) endStall(now time.Time, redone float64) {
	s := g.stall
	g.stall = nil
	cause := s.cause
	if cause == causeUnknown {
		cause = causeWorkerFailure // the workers stepped again with no round seen: restarted alone
	}
	left := s.left
	if left.Before(g.last) {
		left = g.last
	}
	formed := s.formedAt
	if formed.IsZero() || formed.Before(left) {
		formed = left
	}
	g.lost(cause, phaseDetection, left.Sub(g.last).Seconds())
	g.lost(cause, phaseRendezvous, formed.Sub(left).Seconds())
	g.lost(cause, phaseFirstStep, now.Sub(formed).Seconds())
	if redone > 0 && !math.IsInf(redone, 0) {
		d := time.Duration(redone * float64(g.medianStep()))
		g.redone += d
		g.lost(cause, phaseRedone, d.Seconds())
	}
}

func (g *goodput) medianStep() time.Duration {
	if len(g.recent) == 0 {
		return 0
	}
	s := slices.Clone(g.recent)
	slices.Sort(s)
	return s[len(s)/2]
}

// ratio is the time on kept steps (the times between consecutive steps of one stretch, less
// the redone steps' time) over the time since the first step: NaN before a second step.
func (g *goodput) ratio() float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.first.IsZero() {
		return math.NaN()
	}
	wall := g.now().Sub(g.first)
	if wall <= 0 {
		return math.NaN()
	}
	return max(0, (g.steps-g.redone).Seconds()/wall.Seconds())
}
