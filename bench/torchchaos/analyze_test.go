package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestParseLine: rank 0's lines as each launcher passes them on (bare, torchrun's, gorun's
// prefix) and lines that are neither.
func TestParseLine(t *testing.T) {
	at := time.Unix(100, 0)
	for _, tc := range []struct {
		line string
		want event
		ok   bool
	}{
		{"step 12 loss 0.318582", event{At: at, Step: 12}, true},
		{"[node0:0] step 3 loss 0.3", event{At: at, Step: 3}, true},
		{"[default0]:step 7 loss nan", event{At: at, Step: 7}, true},
		{"restored step 20", event{At: at, Step: 20, Restored: true}, true},
		{"[node1:0] restored step 20 from checkpoint /tmp/x/ckpt-00000020.pt", event{At: at, Step: 20, Restored: true}, true},
		{"[node0:0] step 5 loss 0.3 cpu_s 12.5", event{At: at, Step: 5, CPU: 12500 * time.Millisecond, HasCPU: true}, true},
		{"step 5 loss 0.3 cpu_s x", event{}, false},
		{"laststep 3 loss 0.1", event{}, false},
		{"step 3 loss", event{}, false},
		{`{"level":"info","message":"step 3 of the round"}`, event{}, false},
	} {
		t.Run(tc.line, func(t *testing.T) {
			got, ok := parseLine(at, tc.line)
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.want, got)
		})
	}
}

// TestCosts: the steps redone and the time to the next step of each fault, read from rank 0's
// lines (second i of the events' clock is written as s(i)).
func TestCosts(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := func(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }
	steps := func(from, to int, at, every float64) []event {
		var out []event
		for n := from; n <= to; n++ {
			out = append(out, event{At: s(at), Step: n})
			at += every
		}
		return out
	}
	cat := func(parts ...[]event) []event {
		var out []event
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	restored := func(at float64, n int) []event { return []event{{At: s(at), Step: n, Restored: true}} }
	for _, tc := range []struct {
		name   string
		faults []fault
		events []event
		want   []cost
	}{{
		name:   "checkpoint restore: the steps since the checkpoint are redone",
		faults: []fault{{Kind: kindWorker, At: s(7.5)}},
		events: cat(steps(1, 8, 0, 1), restored(20, 5), steps(6, 10, 21, 1)),
		want:   []cost{{Kind: kindWorker, At: s(7.5), Redone: 3, Recovery: 13500 * time.Millisecond}},
	}, {
		name:   "snapshot restore at the step reached: none redone",
		faults: []fault{{Kind: kindNode, At: s(4.5)}},
		events: cat(steps(1, 5, 0, 1), restored(9, 5), steps(6, 7, 10, 1)),
		want:   []cost{{Kind: kindNode, At: s(4.5), Redone: 0, Recovery: 5500 * time.Millisecond}},
	}, {
		name:   "nothing to restore, twice: from the start each time",
		faults: []fault{{Kind: kindWorker, At: s(2.5)}, {Kind: kindNode, At: s(10.5)}},
		events: cat(steps(1, 3, 0, 1), steps(1, 1, 10, 1), steps(1, 2, 20, 1)),
		want: []cost{{Kind: kindWorker, At: s(2.5), Redone: 3, Recovery: 7500 * time.Millisecond},
			{Kind: kindNode, At: s(10.5), Redone: 1, Recovery: 9500 * time.Millisecond}},
	}, {
		name:   "a step line read after the fault is not the restart",
		faults: []fault{{Kind: kindWorker, At: s(3.9)}},
		events: cat(steps(1, 5, 0, 1), restored(9, 4), steps(5, 6, 10, 1)),
		want:   []cost{{Kind: kindWorker, At: s(3.9), Redone: 1, Recovery: 6100 * time.Millisecond}},
	}, {
		name:   "no step after the restart: not recovered",
		faults: []fault{{Kind: kindNode, At: s(2.5)}},
		events: cat(steps(1, 3, 0, 1), restored(9, 3)),
		want:   []cost{{Kind: kindNode, At: s(2.5), Unrecovered: true}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, costs(tc.faults, tc.events))
		})
	}
}

// TestSummarize: the median step, the wall time from the first step to the last and the time
// on kept steps (a redone step counted once, the first step after a restart at the median).
func TestSummarize(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := func(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }
	ev := []event{{At: s(0), Step: 1}, {At: s(1), Step: 2}, {At: s(2), Step: 3}, {At: s(3), Step: 4},
		{At: s(10), Step: 2, Restored: true}, {At: s(11), Step: 3}, {At: s(12), Step: 4}, {At: s(13), Step: 5}}
	got := summarize(ev)
	require.Equal(t, time.Second, got.StepTime)
	require.Equal(t, 13*time.Second, got.Wall)
	require.Equal(t, 5, got.Steps)
	require.Equal(t, 4*time.Second, got.Kept, "steps 2-5 a second each (3 its median), step 1 none: the wall starts there")
	require.InDelta(t, 4.0/13, got.Effective(), 1e-9)

	// A restore at the step reached: the step after it follows its number, not its time.
	ev = []event{{At: s(0), Step: 1}, {At: s(1), Step: 2}, {At: s(9), Step: 2, Restored: true}, {At: s(10), Step: 3}, {At: s(11), Step: 4}}
	got = summarize(ev)
	require.Equal(t, time.Second, got.StepTime)
	require.Equal(t, 3*time.Second, got.Kept, "steps 2-4 a second each, step 3's recovery left out")
}
