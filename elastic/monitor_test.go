package elastic

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStepsLost: an in-place recovery records the steps the workers say
// their exchange threw away; only a worker that says nothing (any
// heartbeat writer other than the embedded trainer) leaves the node's
// own view, which cannot see a rollback that came from another node.
func TestStepsLost(t *testing.T) {
	tests := []struct {
		name     string
		lastStep int
		r        resumption
		want     int
	}{
		{"nothing redone", 12, resumption{step: 13, redone: 0}, 0},
		{"a rank rolled one step back", 12, resumption{step: 12, redone: 1}, 1},
		// The cut-off node of issue 19: its own last step was 5, the job's
		// 438; the job went back to 5 (before the stale-rejoiner fix).
		{"a rejoiner's node rank 0 records the job's rollback, not its own view", 5, resumption{step: 6, redone: 433}, 433},
		{"a survivor's view agrees", 438, resumption{step: 6, redone: 433}, 433},
		{"not reported: the node's own view", 12, resumption{step: 9, redone: math.NaN()}, 4},
		{"not reported, nothing heard before the change", -1, resumption{step: 1, redone: math.NaN()}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, stepsLost(tc.lastStep, tc.r))
		})
	}
}
