// Package goodput measures how much of a job's time went into training
// it kept: the goodput ratio, the time lost to each recovery by cause
// and phase, and the steps redone. Tally is a pure fold over the events
// one agent records (steps of one worker, the agent leaving its round,
// why the round ended, the next round formed); Summary is its figures as
// `gorun status --json` and the agents' Prometheus metrics show them.
//
// The figures of one node. Wall time runs from the first step the node's
// followed worker finished. It splits, exactly, into
//
//   - effective time: the time between consecutive steps of one stretch
//     of training (no recovery between them), less the time of the steps
//     a recovery threw away (redone steps, at the median step time);
//   - lost time: for each recovery, from the last step before it to the
//     first step after it, by phase (below), plus its redone steps' time;
//   - pending time: from the last step to now, not yet counted either
//     way (a step in progress, or a recovery not yet over).
//
// The ratio is effective time over wall time. A recovery's phases, in
// order, each starting where the one before ends:
//
//   - detection: the last step before it to the agent leaving its round
//     (the fault seen, here or by the rendezvous);
//   - rendezvous: to the next round formed on this node;
//   - state transfer: the time the followed worker reports it spent
//     restoring the training state (from its peers or a checkpoint)
//     before its first step after the recovery; 0 when it reports none;
//   - first step: the rest, to that first step: the workers' start or
//     re-forming, and the step itself;
//   - redone steps: the steps thrown away, at the median step time.
//
// The first four sum to the time from the last step before the recovery
// to the first after it. A recovery is charged to one cause (Cause),
// taken from why the round ended.
package goodput

import (
	"math"
	"slices"
	"time"
)

// Cause is what a recovery is charged to.
type Cause int

// The causes of lost time.
const (
	// Restart: a recovery with no fault: nodes joining, or a round that
	// ended for a reason this node was not told.
	Restart Cause = iota
	// Worker: a worker failed (exited badly or hung), here or elsewhere.
	Worker
	// Node: a node was lost (its lease expired, or a peer found its agent
	// dead).
	Node
	// Network: a node alive but unreachable by a member was left out.
	Network
	// Straggler: a node evicted itself as the job's straggler.
	Straggler
	numCauses
)

// Causes are every cause, in the order the figures list them.
var Causes = []Cause{Worker, Node, Network, Straggler, Restart}

func (c Cause) String() string {
	switch c {
	case Worker:
		return "worker"
	case Node:
		return "node"
	case Network:
		return "network"
	case Straggler:
		return "straggler"
	}
	return "restart"
}

// Phase is a part of a recovery's lost time.
type Phase int

// The phases of a recovery, in order (see the package comment).
const (
	Detection Phase = iota
	Rendezvous
	StateTransfer
	FirstStep
	RedoneSteps
	numPhases
)

// Phases are every phase, in order.
var Phases = []Phase{Detection, Rendezvous, StateTransfer, FirstStep, RedoneSteps}

func (p Phase) String() string {
	switch p {
	case Detection:
		return "detection"
	case Rendezvous:
		return "rendezvous"
	case StateTransfer:
		return "state_transfer"
	case FirstStep:
		return "first_step"
	}
	return "redone_steps"
}

// Kind is what an Event records.
type Kind int

// The kinds of event.
const (
	// Step: the followed worker finished a step (a heartbeat).
	Step Kind = iota
	// Left: the agent left the round it trained in, for anything but the
	// job's end.
	Left
	// Ended: the agent learned why its round ended (Event.Cause); it may
	// come before or after Left.
	Ended
	// Formed: the next round formed on this node.
	Formed
)

// Event is one thing an agent recorded.
type Event struct {
	Kind Kind
	At   time.Time
	// Cause is why the round ended (Ended only).
	Cause Cause
	// Redone is the completed steps the recovery before this step threw
	// away (Step only; NaN or 0: none, or not reported).
	Redone float64
	// StateS is the seconds the worker spent restoring its state before
	// this step (Step only; NaN: not reported).
	StateS float64
}

// StepAt is a Step event at with nothing redone and no state transfer
// reported.
func StepAt(at time.Time) Event {
	return Event{Kind: Step, At: at, Redone: math.NaN(), StateS: math.NaN()}
}

// window is how many of the latest step times the median step time is
// taken over.
const window = 16

// Tally is the figures after a sequence of events. It is a value: Apply
// returns a new one and changes nothing it shares (arrays only), so a
// Tally can be copied, compared and kept. Its zero value is a node with
// no step yet.
type Tally struct {
	First, Last time.Time     // the first step, and the latest
	Steps       time.Duration // between consecutive steps of one stretch
	Redone      time.Duration // the redone steps' time
	StepsRedone int
	Recoveries  int
	Lost        [numCauses][numPhases]time.Duration

	recent  [window]time.Duration // the latest step times, a ring
	nRecent int                   // steps timed in all (the ring holds min(n, window))

	// The recovery under way: inStall from Left or Formed to the first
	// step after an Ended or a Formed; left and formed are zero until
	// seen.
	inStall      bool
	caused       bool // cause was given by an Ended event
	cause        Cause
	left, formed time.Time
}

// Apply is t after e. Events come in the order they happened; a step
// before the first is the start, anything before the first step is
// ignored (nothing trained yet to lose).
func (t Tally) Apply(e Event) Tally {
	switch e.Kind {
	case Step:
		return t.step(e)
	case Left:
		if !t.First.IsZero() && !t.inStall {
			t.inStall, t.left = true, e.At
		}
	case Ended:
		if !t.First.IsZero() && !t.caused {
			t.caused, t.cause = true, e.Cause
		}
	case Formed:
		if !t.First.IsZero() {
			// An in-place round may form while the agent never left a
			// state that trains: the recovery began at the last step.
			t.inStall, t.formed = true, e.At
		}
	}
	return t
}

func (t Tally) step(e Event) Tally {
	switch {
	case t.First.IsZero():
		t.First = e.At
	case t.caused || !t.formed.IsZero():
		t = t.endStall(e)
	default:
		// Training, or the agent left its round and nothing says why nor
		// a round formed yet: a step in flight that ended meanwhile (a
		// stop for a signal is no recovery, and a recovery's detection
		// is timed from its last step).
		d := e.At.Sub(t.Last)
		t.Steps += d
		t.recent[t.nRecent%window] = d
		t.nRecent++
	}
	t.Last = e.At
	return t
}

// endStall closes the recovery under way at step e, the first after it.
func (t Tally) endStall(e Event) Tally {
	cause := t.cause
	if !t.caused {
		cause = Restart
	}
	clamp := func(x, lo, hi time.Time) time.Time {
		if x.IsZero() || x.Before(lo) {
			return lo
		}
		if x.After(hi) {
			return hi
		}
		return x
	}
	left := clamp(t.left, t.Last, e.At)
	formed := clamp(t.formed, left, e.At)
	state := time.Duration(0)
	if e.StateS > 0 && !math.IsInf(e.StateS, 0) {
		state = min(time.Duration(e.StateS*float64(time.Second)), e.At.Sub(formed))
	}
	lost := &t.Lost[cause]
	lost[Detection] += left.Sub(t.Last)
	lost[Rendezvous] += formed.Sub(left)
	lost[StateTransfer] += state
	lost[FirstStep] += e.At.Sub(formed) - state
	if e.Redone > 0 && !math.IsInf(e.Redone, 0) {
		n := int(e.Redone)
		d := time.Duration(n) * t.medianStep()
		t.StepsRedone += n
		t.Redone += d
		lost[RedoneSteps] += d
	}
	t.Recoveries++
	t.inStall, t.caused, t.cause, t.left, t.formed = false, false, Restart, time.Time{}, time.Time{}
	return t
}

func (t Tally) medianStep() time.Duration {
	n := min(t.nRecent, window)
	if n == 0 {
		return 0
	}
	s := slices.Clone(t.recent[:n])
	slices.Sort(s)
	return s[n/2]
}

// Compute is the tally of events, in order.
func Compute(events []Event) Tally {
	var t Tally
	for _, e := range events {
		t = t.Apply(e)
	}
	return t
}

// Summary is a node's figures at one time, as `gorun status --json` and
// the agents' metrics show them (see the package comment for what each
// counts). WallSeconds = EffectiveSeconds + LostSeconds + PendingSeconds,
// LostSeconds is the sum of LostByCause and of LostByPhase.
type Summary struct {
	// Measured is false before the node's first step: every figure is 0.
	Measured bool `json:"measured"`
	// Ratio is EffectiveSeconds / WallSeconds, 0 when not measured.
	Ratio            float64 `json:"ratio"`
	WallSeconds      float64 `json:"wall_seconds"`
	EffectiveSeconds float64 `json:"effective_seconds"`
	LostSeconds      float64 `json:"lost_seconds"`
	PendingSeconds   float64 `json:"pending_seconds"`
	// LostByCause has every cause's name (worker, node, network,
	// straggler, restart), 0 for those not seen.
	LostByCause map[string]float64 `json:"lost_by_cause"`
	// LostByPhase has every phase's name (detection, rendezvous,
	// state_transfer, first_step, redone_steps).
	LostByPhase map[string]float64 `json:"lost_by_phase"`
	// Lost is the lost seconds by cause, then phase: what the two above
	// sum.
	Lost        map[string]map[string]float64 `json:"lost"`
	StepsRedone int                           `json:"steps_redone"`
	Recoveries  int                           `json:"recoveries"`
}

// Summary is t's figures at now (the end of wall time; a now before the
// last step counts as the last step).
func (t Tally) Summary(now time.Time) Summary {
	s := Summary{LostByCause: map[string]float64{}, LostByPhase: map[string]float64{}, Lost: map[string]map[string]float64{}}
	var lost time.Duration
	for _, c := range Causes {
		s.Lost[c.String()] = map[string]float64{}
		var byCause time.Duration
		for _, p := range Phases {
			d := t.Lost[c][p]
			s.Lost[c.String()][p.String()] = d.Seconds()
			s.LostByPhase[p.String()] += d.Seconds()
			byCause += d
		}
		s.LostByCause[c.String()] = byCause.Seconds()
		lost += byCause
	}
	if t.First.IsZero() {
		return s
	}
	if now.Before(t.Last) {
		now = t.Last
	}
	wall := now.Sub(t.First)
	s.Measured = true
	s.WallSeconds = wall.Seconds()
	s.EffectiveSeconds = (t.Steps - t.Redone).Seconds()
	s.LostSeconds = lost.Seconds()
	s.PendingSeconds = now.Sub(t.Last).Seconds()
	if wall > 0 {
		s.Ratio = s.EffectiveSeconds / s.WallSeconds
	}
	s.StepsRedone, s.Recoveries = t.StepsRedone, t.Recoveries
	return s
}
