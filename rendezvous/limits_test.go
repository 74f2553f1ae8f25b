package rendezvous_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/rendezvous"
)

// A SLURM step of 4 nodes without --nnodes (launcher.SLURMNodes: 1:4,
// starting on 4): its first round waits for all 4 nodes, and a later
// round forms with the nodes left, whether the round opened for a lost
// node's in-place recovery or for a restart; an explicit range keeps its
// MIN in every round.
func TestShouldFreezeNeedsStartNodesOnlyFirst(t *testing.T) {
	slurm := rendezvous.Limits{MinNodes: 1, MaxNodes: 4, StartNodes: 4}
	ranged := rendezvous.Limits{MinNodes: 3, MaxNodes: 4}
	tests := []struct {
		name                  string
		lim                   rendezvous.Limits
		round, joined, alive  int
		lastCallPassed, wants bool
	}{
		{"first round, 3 of 4 nodes, last call over: waits", slurm, 0, 3, 3, true, false},
		{"first round, every node", slurm, 0, 4, 4, false, true},
		{"after the first node's loss: the 3 left", slurm, 1, 3, 3, false, true},
		{"after three losses: the one left", slurm, 3, 1, 1, false, true},
		{"a live node not yet joined: waits for it", slurm, 1, 2, 3, false, false},
		{"a range keeps its MIN after the first round", ranged, 1, 2, 2, true, false},
		{"a range forms at MIN after the last call", ranged, 0, 3, 3, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := rendezvous.State{Round: tt.round, Phase: rendezvous.PhaseJoinable}
			require.Equal(t, tt.wants, rendezvous.ShouldFreeze(st, tt.joined, tt.alive, tt.lim, tt.lastCallPassed))
		})
	}
}
