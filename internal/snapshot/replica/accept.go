package replica

import (
	"fmt"
	"slices"
)

// acceptance is which pushes a server takes: those tagged round, except of
// the ranks in own; none while round < 0.
type acceptance struct {
	round int
	own   []int
}

func newAcceptance(round int, own []int) acceptance {
	if round < 0 {
		return acceptance{round: -1}
	}
	return acceptance{round: round, own: slices.Clone(own)}
}

// admit says why a push of rank tagged round is refused, or nil.
func (a acceptance) admit(round, rank int) error {
	switch {
	case a.round < 0:
		return fmt.Errorf("a push of round %d: this agent accepts none now (between rounds)", round)
	case round != a.round:
		return fmt.Errorf("a push of round %d: this agent is in round %d", round, a.round)
	case slices.Contains(a.own, rank):
		return fmt.Errorf("rank %d is one of this agent's own in round %d", rank, round)
	}
	return nil
}
