package profile

import (
	"fmt"
	"io"
	"time"
)

// Phase is one kind of work a training step spends its time on.
type Phase int

// The phases of a step, in the order records and tables list them.
const (
	// GEMM is the matrix products of the linear layers and the output
	// projection (their bias copies included).
	GEMM Phase = iota
	// Attention is the per-head attention (q·kᵀ, softmax, P·v and their
	// gradients) and the copies into and out of the head layout.
	Attention
	// Elementwise is the row-wise work: embeddings, layer norms, GELU, the
	// residual additions, cross-entropy and the bias gradients.
	Elementwise
	// Optimizer is the gradient norm, clipping and the AdamW update of this
	// rank's slice.
	Optimizer
	// Collectives is the gradient reduce-scatter, the loss and norm
	// all-reduce and the parameter all-gather, waits for slower peers
	// included.
	Collectives
	// Waiting is everything else: reading the batch, writing the metrics
	// record, the after-step hook (checkpoints) and the gaps between the
	// timed phases.
	Waiting
	// NumPhases is the number of phases.
	NumPhases
)

var phaseNames = [NumPhases]string{"gemm", "attention", "elementwise", "optimizer", "collectives", "waiting"}

// String is the phase's name as records and tables write it, e.g. "gemm".
func (p Phase) String() string {
	if p < 0 || p >= NumPhases {
		return fmt.Sprintf("phase(%d)", int(p))
	}
	return phaseNames[p]
}

// Step is the time one step spent in each phase. The phases add up to
// Total exactly: Waiting takes what the others leave.
type Step struct {
	Phases [NumPhases]time.Duration
	Total  time.Duration // from the end of the previous step to the end of this one
}

// Timer attributes the time between consecutive laps to phases, reading
// the monotonic clock once per lap. A nil *Timer does nothing and costs a
// nil check per call, so callers can leave the laps in place with
// profiling off. A Timer must be used from one goroutine.
type Timer struct {
	start, last time.Time
	step        Step
}

// NewTimer returns a Timer whose first step starts at start.
func NewTimer(start time.Time) *Timer {
	return &Timer{start: start, last: start}
}

// Lap adds the time since the previous lap (or the start of the step) to
// phase p, which must be one of the phases (GEMM..Waiting).
func (t *Timer) Lap(p Phase) {
	if t == nil {
		return
	}
	now := time.Now()
	t.step.Phases[p] += now.Sub(t.last)
	t.last = now
}

// EndStep closes the step at now (the time the caller stamps the step
// with): the time since the last lap goes to Waiting, and the next step
// starts at now. It returns the step's figures; a nil Timer returns the
// zero Step.
func (t *Timer) EndStep(now time.Time) Step {
	if t == nil {
		return Step{}
	}
	t.step.Phases[Waiting] += now.Sub(t.last)
	t.step.Total = now.Sub(t.start)
	s := t.step
	t.step, t.start, t.last = Step{}, now, now
	return s
}

// Summary adds up the steps of a run.
type Summary struct {
	Steps int  // steps added
	Sum   Step // their phase times and wall times, added up
}

// Add adds one step.
func (s *Summary) Add(st Step) {
	s.Steps++
	s.Sum.Total += st.Total
	for p := range s.Sum.Phases {
		s.Sum.Phases[p] += st.Phases[p]
	}
}

// WriteTable writes the summary as a table: per phase the total seconds,
// milliseconds per step and share of the step time, then the whole step.
// It returns the first write error.
func (s Summary) WriteTable(w io.Writer) error {
	steps := max(s.Steps, 1)
	row := func(name string, d time.Duration) string {
		share := 0.0
		if s.Sum.Total > 0 {
			share = 100 * d.Seconds() / s.Sum.Total.Seconds()
		}
		return fmt.Sprintf("%-12s %10.3f %10.2f %6.1f%%\n", name, d.Seconds(), 1e3*d.Seconds()/float64(steps), share)
	}
	out := fmt.Sprintf("profile: %d steps\n%-12s %10s %10s %7s\n", s.Steps, "phase", "total s", "ms/step", "share")
	for p := range NumPhases {
		out += row(p.String(), s.Sum.Phases[p])
	}
	out += row("step", s.Sum.Total)
	if _, err := io.WriteString(w, out); err != nil {
		return fmt.Errorf("profile: write table: %w", err)
	}
	return nil
}
