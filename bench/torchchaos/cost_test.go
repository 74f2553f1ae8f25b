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
