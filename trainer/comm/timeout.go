package comm

import (
	"slices"
	"time"
)

// TimeoutRule derives the bound of a collective's sends and receives
// from the step time a trainer observes, so that a peer gone silent is
// noticed within a few steps instead of a fixed Config.Timeout:
//
//	timeout = min(Ceiling, max(Floor, Factor x median step time))
//
// Before any step was observed the timeout is Ceiling. A zero Floor,
// Factor or Ceiling is DefaultFloor, DefaultFactor or DefaultTimeout.
type TimeoutRule struct {
	// Floor is the least timeout, whatever the steps take: a GC pause, a
	// page-in after a re-form or a busy machine must not fail a world.
	Floor time.Duration
	// Factor is how many median steps a send or receive may take.
	Factor float64
	// Ceiling is the most it may take (the world's Config.Timeout).
	Ceiling time.Duration
}

// The defaults of TimeoutRule: 10 s at least, 10 median steps (and 2
// minutes at most, DefaultTimeout).
const (
	DefaultFloor  = 10 * time.Second
	DefaultFactor = 10
)

// For is the timeout for a median step time of median; ok false (no step
// observed yet) gives the ceiling.
func (r TimeoutRule) For(median time.Duration, ok bool) time.Duration {
	r = r.withDefaults()
	if !ok {
		return r.Ceiling
	}
	scaled := r.Factor * float64(median)
	if scaled >= float64(r.Ceiling) { // before the conversion, which could overflow
		return r.Ceiling
	}
	return min(r.Ceiling, max(r.Floor, time.Duration(scaled)))
}

func (r TimeoutRule) withDefaults() TimeoutRule {
	if r.Floor <= 0 {
		r.Floor = DefaultFloor
	}
	if r.Factor <= 0 {
		r.Factor = DefaultFactor
	}
	if r.Ceiling <= 0 {
		r.Ceiling = DefaultTimeout
	}
	return r
}

// stepWindow is how many of the last steps StepTimes keeps.
const stepWindow = 32

// StepTimes keeps the durations of the last steps (32) and their median:
// the median, not the mean, so one slow step (a checkpoint written, a
// re-form) does not move the timeout. The zero StepTimes is empty.
type StepTimes struct {
	last [stepWindow]time.Duration
	n    int // steps recorded, up to stepWindow
	next int // where the next one goes
}

// Add records one step's duration (a negative one counts as 0).
func (s *StepTimes) Add(d time.Duration) {
	s.last[s.next] = max(d, 0)
	s.next = (s.next + 1) % stepWindow
	s.n = min(s.n+1, stepWindow)
}

// Median is the median of the recorded steps (the upper one of an even
// count); ok is false when none was recorded.
func (s *StepTimes) Median() (median time.Duration, ok bool) {
	if s.n == 0 {
		return 0, false
	}
	d := slices.Clone(s.last[:s.n])
	slices.Sort(d)
	return d[s.n/2], true
}

// Reset forgets every step (a new world's steps take another time).
func (s *StepTimes) Reset() { *s = StepTimes{} }
