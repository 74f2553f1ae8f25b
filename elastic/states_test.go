package elastic

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// States lists every state the transition table names, each once.
func TestStatesCoverTransitions(t *testing.T) {
	states := States()
	require.Equal(t, StateInit, states[0])
	for from, tos := range transitions {
		for _, s := range append([]State{from}, tos...) {
			require.Contains(t, states, s, "state %d (%s) is missing from States", s, s)
		}
	}
	names := map[string]bool{}
	for _, s := range states {
		require.False(t, names[s.String()], "%s twice", s)
		names[s.String()] = true
	}
	require.True(t, slices.IsSorted(states))
}
