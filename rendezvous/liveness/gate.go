package liveness

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/rs/zerolog"
)

// Gate keeps a node that was left out of the job for being unreachable
// from joining a round again until it reaches every member: rejoinPasses
// probes of them all in a row (Open; the protocol asks again RejoinEvery
// later while it says no). A node never left out passes it.
type Gate struct {
	self    string
	members func(ctx context.Context) ([]Peer, error)
	log     zerolog.Logger

	mu sync.Mutex
	s  gateState
}

// NewGate returns the gate of node self, whose peers members lists (the
// members of the last round that froze, but self), logging to log.
func NewGate(self string, members func(ctx context.Context) ([]Peer, error), log zerolog.Logger) *Gate {
	return &Gate{self: self, members: members, log: log}
}

// gateState is the gate's state: closed while leftOut, with the probes
// of every member that passed in a row since, or the last that failed.
type gateState struct {
	leftOut bool
	passes  int
	lastErr error
}

// next is the gate after one round of probes of every member that failed
// with err (nil: they all passed), and whether the node may join now. A
// failure starts the count again; rejoinPasses passes in a row open the
// gate and forget the node was left out.
func (s gateState) next(err error) (gateState, bool) {
	switch {
	case !s.leftOut:
		return s, true
	case err != nil:
		return gateState{leftOut: true, lastErr: err}, false
	case s.passes+1 < rejoinPasses:
		return gateState{leftOut: true, passes: s.passes + 1, lastErr: s.lastErr}, false
	}
	return gateState{}, true
}

// LeftOut takes the ids a round's state names left out (round and reason
// are that state's): when they hold this node, the gate closes until Open
// has seen it reach every member.
func (g *Gate) LeftOut(round int, ids []string, reason string) {
	if !slices.Contains(ids, g.self) {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.s.leftOut {
		g.log.Warn().Int("round", round).Str("reason", reason).Msg("this node was left out of the job's next round")
	}
	g.s.leftOut = true
}

// Open says whether this node may join a round: it was never left out,
// or it reached every member rejoinPasses times in a row, this call's
// probes included. Probing ends with ctx.
func (g *Gate) Open(ctx context.Context) bool {
	g.mu.Lock()
	left := g.s.leftOut
	g.mu.Unlock()
	if !left {
		return true
	}
	peers, err := g.members(ctx)
	if err == nil {
		err = probeAll(ctx, peers)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	before := g.s
	var open bool
	g.s, open = g.s.next(err)
	switch {
	case err != nil && (before.lastErr == nil || before.passes > 0):
		g.log.Info().Err(err).Msg("left out of the job: waiting until this node reaches every member")
	case open:
		g.log.Info().Msg("this node reaches every member again: rejoining the job")
	}
	return open
}

// Err is why this node, left out, did not get back in: the last probe
// that failed. Nil when it is not left out.
func (g *Gate) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.s.leftOut {
		return nil
	}
	return cmp.Or(g.s.lastErr, errors.New("its probes of the members never passed"))
}
