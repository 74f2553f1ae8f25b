package goodput

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCompute folds event sequences and checks every figure, and that
// wall time splits exactly into effective, lost and pending time.
func TestCompute(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	step := func(s float64) Event { return StepAt(at(s)) }
	stepAfter := func(s, redone, stateS float64) Event {
		e := step(s)
		e.Redone, e.StateS = redone, stateS
		return e
	}
	steps := func(from, to float64) []Event { // one a second, from..to
		var out []Event
		for s := from; s <= to; s++ {
			out = append(out, step(s))
		}
		return out
	}
	cat := func(parts ...[]Event) []Event {
		var out []Event
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	type lost struct {
		cause Cause
		phase Phase
		s     float64
	}
	tests := []struct {
		name        string
		events      []Event
		now         float64
		measured    bool
		ratio       float64
		effective   float64
		pending     float64
		lost        []lost // every other cell is 0
		stepsRedone int
		recoveries  int
	}{
		{name: "no step", events: []Event{{Kind: Left, At: at(1)}, {Kind: Formed, At: at(2)}}, now: 3},
		{name: "steady", events: steps(0, 10), now: 12, measured: true, ratio: 10.0 / 12, effective: 10, pending: 2},
		{
			// t 0-4 steps; 5 left; cause worker; 7 formed; 10 first step
			// after, 0.5 s of it restoring state, 2 steps redone (1 s median).
			name: "worker failure, every phase",
			events: cat(steps(0, 4), []Event{{Kind: Left, At: at(5)}, {Kind: Ended, Cause: Worker}, {Kind: Formed, At: at(7)},
				stepAfter(10, 2, 0.5), step(11), step(12)}),
			now: 12, measured: true, ratio: 4.0 / 12, effective: 4,
			lost: []lost{{Worker, Detection, 1}, {Worker, Rendezvous, 2}, {Worker, StateTransfer, 0.5}, {Worker, FirstStep, 2.5},
				{Worker, RedoneSteps, 2}},
			stepsRedone: 2, recoveries: 1,
		},
		{
			// The cause comes before the agent leaves (a local worker's
			// exit): the same recovery.
			name: "cause before left, node",
			events: cat(steps(0, 2), []Event{{Kind: Ended, Cause: Node, At: at(2.5)}, {Kind: Left, At: at(3)}, {Kind: Formed, At: at(4)},
				stepAfter(5, math.NaN(), math.NaN())}),
			now: 5, measured: true, ratio: 2.0 / 5, effective: 2,
			lost:       []lost{{Node, Detection, 1}, {Node, Rendezvous, 1}, {Node, FirstStep, 1}},
			recoveries: 1,
		},
		{
			// An in-place round formed with no Left seen: detection and
			// rendezvous are one, charged from the last step to the round.
			name:   "formed without left, straggler",
			events: cat(steps(0, 2), []Event{{Kind: Ended, Cause: Straggler}, {Kind: Formed, At: at(4)}, stepAfter(4.5, 0, 0.25)}),
			now:    4.5, measured: true, ratio: 2.0 / 4.5, effective: 2,
			lost:       []lost{{Straggler, Rendezvous, 2}, {Straggler, StateTransfer, 0.25}, {Straggler, FirstStep, 0.25}},
			recoveries: 1,
		},
		{
			name:   "no cause told: restart",
			events: cat(steps(0, 2), []Event{{Kind: Left, At: at(3)}, {Kind: Formed, At: at(3.5)}, step(4)}),
			now:    4, measured: true, ratio: 2.0 / 4, effective: 2,
			lost:       []lost{{Restart, Detection, 1}, {Restart, Rendezvous, 0.5}, {Restart, FirstStep, 0.5}},
			recoveries: 1,
		},
		{
			// A state transfer reported longer than the time from the round
			// formed (clocks of two processes) is cut to it.
			name:   "state transfer cut to the phase",
			events: cat(steps(0, 1), []Event{{Kind: Left, At: at(2)}, {Kind: Ended, Cause: Network}, {Kind: Formed, At: at(3)}, stepAfter(4, 0, 9)}),
			now:    4, measured: true, ratio: 1.0 / 4, effective: 1,
			lost:       []lost{{Network, Detection, 1}, {Network, Rendezvous, 1}, {Network, StateTransfer, 1}},
			recoveries: 1,
		},
		{
			// Two recoveries; the redone steps are timed at the median of
			// the latest steps (1 s, 1 s, 3 s: 1 s).
			name: "two recoveries, median step",
			events: cat([]Event{step(0), step(1), step(2), step(5)}, []Event{{Kind: Left, At: at(6)}, {Kind: Ended, Cause: Worker},
				{Kind: Formed, At: at(7)}, stepAfter(8, 1, math.NaN()), step(9), {Kind: Left, At: at(9.5)}, {Kind: Ended, Cause: Node},
				{Kind: Formed, At: at(10)}, stepAfter(11, 3, math.NaN())}),
			now: 12, measured: true, ratio: (5.0 + 1 - 1 - 3) / 12, effective: 2, pending: 1,
			lost: []lost{{Worker, Detection, 1}, {Worker, Rendezvous, 1}, {Worker, FirstStep, 1}, {Worker, RedoneSteps, 1},
				{Node, Detection, 0.5}, {Node, Rendezvous, 0.5}, {Node, FirstStep, 1}, {Node, RedoneSteps, 3}},
			stepsRedone: 4, recoveries: 2,
		},
		{
			// A step that ends after the agent left, with no cause and no
			// round yet, is a step (in flight); a stop is no recovery.
			name:   "stopped, a step in flight",
			events: cat(steps(0, 3), []Event{{Kind: Left, At: at(3.5)}, step(4)}),
			now:    6, measured: true, ratio: 4.0 / 6, effective: 4, pending: 2,
		},
		{
			name: "a step in flight, then the recovery",
			events: cat(steps(0, 3), []Event{{Kind: Left, At: at(3.5)}, step(4), {Kind: Ended, Cause: Worker}, {Kind: Formed, At: at(5)},
				step(6)}),
			now: 6, measured: true, ratio: 4.0 / 6, effective: 4,
			lost:       []lost{{Worker, Rendezvous, 1}, {Worker, FirstStep, 1}},
			recoveries: 1,
		},
		{
			name:   "a recovery under way is pending",
			events: cat(steps(0, 3), []Event{{Kind: Left, At: at(4)}, {Kind: Ended, Cause: Worker}}),
			now:    10, measured: true, ratio: 3.0 / 10, effective: 3, pending: 7,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Compute(tt.events).Summary(at(tt.now))
			require.Equal(t, tt.measured, s.Measured)
			require.InDelta(t, tt.ratio, s.Ratio, 1e-9, "ratio")
			require.InDelta(t, tt.effective, s.EffectiveSeconds, 1e-9, "effective")
			require.InDelta(t, tt.pending, s.PendingSeconds, 1e-9, "pending")
			require.Equal(t, tt.stepsRedone, s.StepsRedone)
			require.Equal(t, tt.recoveries, s.Recoveries)
			want := map[string]map[string]float64{}
			for _, c := range Causes {
				want[c.String()] = map[string]float64{}
				for _, p := range Phases {
					want[c.String()][p.String()] = 0
				}
			}
			total := 0.0
			for _, l := range tt.lost {
				want[l.cause.String()][l.phase.String()] = l.s
				total += l.s
			}
			require.Equal(t, want, roundAll(s.Lost))
			require.InDelta(t, total, s.LostSeconds, 1e-9, "lost")
			byCause, byPhase := 0.0, 0.0
			for _, v := range s.LostByCause {
				byCause += v
			}
			for _, v := range s.LostByPhase {
				byPhase += v
			}
			require.InDelta(t, s.LostSeconds, byCause, 1e-9, "lost by cause sums to lost")
			require.InDelta(t, s.LostSeconds, byPhase, 1e-9, "lost by phase sums to lost")
			if s.Measured {
				require.InDelta(t, s.WallSeconds, s.EffectiveSeconds+s.LostSeconds+s.PendingSeconds, 1e-9, "wall = effective + lost + pending")
			}
		})
	}
}

func roundAll(m map[string]map[string]float64) map[string]map[string]float64 {
	for _, row := range m {
		for k, v := range row {
			row[k] = math.Round(v*1e9) / 1e9
		}
	}
	return m
}

// TestApplyIsPure: applying an event leaves the tally it was applied to
// as it was (a Tally is a value, shared by nothing).
func TestApplyIsPure(t *testing.T) {
	t0 := time.Unix(0, 0)
	var a Tally
	for i := range 20 {
		a = a.Apply(StepAt(t0.Add(time.Duration(i) * time.Second)))
	}
	before := a
	b := a.Apply(Event{Kind: Left, At: t0.Add(21 * time.Second)}).Apply(Event{Kind: Ended, Cause: Worker}).
		Apply(Event{Kind: Formed, At: t0.Add(22 * time.Second)}).Apply(Event{Kind: Step, At: t0.Add(23 * time.Second), Redone: 2})
	require.Equal(t, before, a)
	require.NotEqual(t, a, b)
	require.Equal(t, 2, b.StepsRedone)
}

// TestJobOf adds nodes' reports up as node-seconds, takes the most
// recoveries and redone steps any node saw, leaves out nodes with no
// step, and writes at most two lines.
func TestJobOf(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	recovered := func(stateS float64, redone float64) Summary { // steps 0-4, worker failure, step at 10, now 10
		var evs []Event
		for s := range 5 {
			evs = append(evs, StepAt(at(float64(s))))
		}
		last := StepAt(at(10))
		last.Redone, last.StateS = redone, stateS
		evs = append(evs, Event{Kind: Left, At: at(5)}, Event{Kind: Ended, Cause: Worker}, Event{Kind: Formed, At: at(6)}, last)
		return Compute(evs).Summary(at(10))
	}
	tests := []struct {
		name      string
		nodes     []NodeReport
		measured  bool
		ratio     float64
		wall      float64
		lost      float64
		state     float64
		redone    int
		lines     []string
		nodeHosts []string
	}{
		{name: "none", nodeHosts: []string{}},
		{name: "no step yet", nodes: []NodeReport{{Host: "b", Summary: Tally{}.Summary(at(1))}}, nodeHosts: []string{"b"}},
		{
			name:     "two nodes",
			nodes:    []NodeReport{{Host: "b", Summary: recovered(1, 1)}, {Host: "a", Summary: recovered(2, 1)}, {Host: "c", Summary: Tally{}.Summary(at(1))}},
			measured: true, ratio: 6.0 / 20, wall: 20, lost: 14, state: 3, redone: 1,
			lines: []string{
				"goodput: 0.300 (effective 6.0 of 20.0 node-seconds, 2 nodes); 1 recoveries, 1 steps redone",
				"time lost: 14.0 node-seconds: worker 14.0; detection 2.0, rendezvous 2.0, state transfer 3.0, first step 5.0, redone steps 2.0",
			},
			nodeHosts: []string{"a", "b", "c"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			values := map[string][]byte{"broken": []byte("{")}
			for i, n := range tt.nodes {
				values[string(rune('0'+i))] = n.Encode()
			}
			j := JobOfValues(values)
			require.Equal(t, tt.measured, j.Measured)
			require.InDelta(t, tt.ratio, j.Ratio, 1e-9)
			require.InDelta(t, tt.wall, j.WallSeconds, 1e-9)
			require.InDelta(t, tt.lost, j.LostSeconds, 1e-9)
			require.InDelta(t, tt.lost, j.LostByCause["worker"], 1e-9)
			require.InDelta(t, tt.state, j.LostByPhase["state_transfer"], 1e-9)
			require.InDelta(t, j.WallSeconds, j.EffectiveSeconds+j.LostSeconds+j.PendingSeconds, 1e-9)
			require.Equal(t, tt.redone, j.StepsRedone)
			require.Equal(t, tt.lines, j.Lines())
			var hosts []string
			for _, n := range j.Nodes {
				hosts = append(hosts, n.Host)
			}
			if hosts == nil {
				hosts = []string{}
			}
			require.Equal(t, tt.nodeHosts, hosts)
		})
	}
}
