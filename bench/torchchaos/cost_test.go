package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMedianCost: each pair's cost is its own ratio, and the median is taken over the pairs'
// costs, not over their steps.
func TestMedianCost(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, tc := range []struct {
		name  string
		pairs []costPair
		want  float64
	}{
		{"none", nil, 0},
		{"one", []costPair{{Off: ms(1000), On: ms(1100)}}, 0.1},
		{"odd count: the middle cost", []costPair{{Off: ms(1000), On: ms(1300)}, {Off: ms(2000), On: ms(2100)}, {Off: ms(1000), On: ms(1100)}}, 0.1},
		{"even count: mean of the middle two", []costPair{{Off: ms(1000), On: ms(1100)}, {Off: ms(1000), On: ms(1300)}}, 0.2},
		{"a pair with an unknown step costs 0", []costPair{{Off: 0, On: ms(1100)}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.InDelta(t, tc.want, medianCost(tc.pairs), 1e-9)
		})
	}
}

// TestCPUCost: a pair's CPU cost is the runs' CPU difference, per step and as a fraction of the
// run without snapshots; unknown figures cost 0.
func TestCPUCost(t *testing.T) {
	s := func(n float64) time.Duration { return time.Duration(n * float64(time.Second)) }
	for _, tc := range []struct {
		name    string
		pair    costPair
		perStep time.Duration
		frac    float64
	}{
		{"40 steps, 4 s more", costPair{OffCPU: s(100), OnCPU: s(104), Steps: 40}, s(0.1), 0.04},
		{"cheaper with snapshots (noise)", costPair{OffCPU: s(100), OnCPU: s(99), Steps: 10}, s(-0.1), -0.01},
		{"no steps, no CPU", costPair{}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.perStep, tc.pair.CPUPerStep())
			require.InDelta(t, tc.frac, tc.pair.CPUCost(), 1e-9)
		})
	}
}
