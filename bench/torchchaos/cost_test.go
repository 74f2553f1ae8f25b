package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBlockCost: a cost run's steps are measured by their kind (a snapshot after the step or
// not, --save-blocks), each from the line before it; the first step of each block, a step after
// a restart and a step without a CPU figure are left out.
func TestBlockCost(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	// steps makes the events of steps from..to, each taking step(s) of time and cpu(s) of CPU.
	steps := func(from, to int, step, cpu func(s int) time.Duration) []event {
		at, used := t0, time.Duration(0)
		var evs []event
		for s := from; s <= to; s++ {
			at, used = at.Add(step(s)), used+cpu(s)
			evs = append(evs, event{At: at, Step: s, CPU: used, HasCPU: true})
		}
		return evs
	}
	// With blocks of 2: steps 1-2 save, 3-4 do not, 5-6 save, ...
	costly := func(s int) time.Duration {
		if savesAfter(s, 2) {
			return ms(1100)
		}
		return ms(1000)
	}
	firstOfBlock := func(s int) time.Duration {
		if (s-1)%2 == 0 {
			return ms(5000) // must not count
		}
		return costly(s)
	}
	noCPU := steps(1, 8, costly, costly)
	for i := range noCPU {
		noCPU[i].HasCPU = false
	}
	restarted := append(steps(1, 4, costly, costly), event{At: t0.Add(time.Hour), Step: 2, Restored: true})
	restarted = append(restarted, event{At: t0.Add(time.Hour + ms(1)), Step: 3, CPU: ms(1), HasCPU: true})
	for _, tc := range []struct {
		name    string
		events  []event
		want    blockCost
		cost    float64
		cpuCost float64
	}{
		{"10 % more with a snapshot", steps(1, 12, costly, costly),
			blockCost{On: ms(1100), Off: ms(1000), OnCPU: ms(1100), OffCPU: ms(1000), NOn: 3, NOff: 3}, 0.1, 0.1},
		{"the first step of a block is left out", steps(1, 12, firstOfBlock, firstOfBlock),
			blockCost{On: ms(1100), Off: ms(1000), OnCPU: ms(1100), OffCPU: ms(1000), NOn: 3, NOff: 3}, 0.1, 0.1},
		{"the same CPU, a longer step", steps(1, 8, costly, func(int) time.Duration { return ms(700) }),
			blockCost{On: ms(1100), Off: ms(1000), OnCPU: ms(700), OffCPU: ms(700), NOn: 2, NOff: 2}, 0.1, 0},
		{"no CPU figures: nothing measured", noCPU, blockCost{}, 0, 0},
		{"no step without a snapshot: no figure", steps(1, 2, costly, costly), blockCost{NOn: 1}, 0, 0},
		{"a restart between two lines is no step", restarted,
			blockCost{On: ms(1100), Off: ms(1000), OnCPU: ms(1100), OffCPU: ms(1000), NOn: 1, NOff: 1}, 0.1, 0.1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := blockCostOf(tc.events, 2)
			require.Equal(t, tc.want, got)
			require.InDelta(t, tc.cost, got.Cost(), 1e-9)
			require.InDelta(t, tc.cpuCost, got.CPUCost(), 1e-9)
		})
	}
}

// TestMedianOf: the median over the runs' own ratios (the mean of the middle two for an even
// count), not over their steps.
func TestMedianOf(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, tc := range []struct {
		name string
		runs []blockCost
		want float64
	}{
		{"none", nil, 0},
		{"one", []blockCost{{Off: ms(1000), On: ms(1100)}}, 0.1},
		{"odd count: the middle cost", []blockCost{{Off: ms(1000), On: ms(1300)}, {Off: ms(2000), On: ms(2100)}, {Off: ms(1000), On: ms(1100)}}, 0.1},
		{"even count: mean of the middle two", []blockCost{{Off: ms(1000), On: ms(1100)}, {Off: ms(1000), On: ms(1300)}}, 0.2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.InDelta(t, tc.want, medianOf(tc.runs, blockCost.Cost), 1e-9)
		})
	}
}
