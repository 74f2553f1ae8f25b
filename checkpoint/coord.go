package checkpoint

import (
	"context"
	"fmt"
	"sync"
)

// Coordinator is what saving and loading need from the other ranks. Every rank calls the same
// sequence of collectives; a call blocks until all ranks made it, or until ctx ends or a rank is
// lost, and then returns an error. A Coordinator given to an async save is used from a background
// goroutine, so it must not share a stream of messages with the caller's own collectives.
type Coordinator interface {
	// Rank is this rank, in [0, Size()).
	Rank() int
	// Size is the number of ranks.
	Size() int
	// GatherBytes collects every rank's b at rank 0, in rank order; other ranks get nil.
	GatherBytes(ctx context.Context, b []byte) ([][]byte, error)
	// BroadcastBytes returns rank 0's b on every rank; other ranks' b is ignored.
	BroadcastBytes(ctx context.Context, b []byte) ([]byte, error)
}

// Solo returns the Coordinator of a single process: rank 0 of 1.
func Solo() Coordinator { return solo{} }

type solo struct{}

func (solo) Rank() int { return 0 }
func (solo) Size() int { return 1 }
func (solo) GatherBytes(ctx context.Context, b []byte) ([][]byte, error) {
	return [][]byte{b}, ctx.Err()
}
func (solo) BroadcastBytes(ctx context.Context, b []byte) ([]byte, error) { return b, ctx.Err() }

// NewLocalGroup returns n Coordinators for n ranks that are goroutines of one process, for tests,
// benchmarks and single-node tools. If one rank's ctx ends inside a collective, that collective
// fails on every rank and the group is broken for good.
func NewLocalGroup(n int) []Coordinator {
	g := &localGroup{n: n}
	g.cur = g.newRound()
	out := make([]Coordinator, n)
	for i := range out {
		out[i] = &localRank{g: g, rank: i}
	}
	return out
}

type localGroup struct {
	n      int
	mu     sync.Mutex
	cur    *round
	broken error
}

// round is one collective: every rank deposits its bytes, the last one closes done.
type round struct {
	data    [][]byte
	arrived int
	done    chan struct{}
	failed  chan struct{}
	err     error
}

func (g *localGroup) newRound() *round {
	return &round{data: make([][]byte, g.n), done: make(chan struct{}), failed: make(chan struct{})}
}

// exchange deposits b as rank's contribution and returns everyone's once all arrived.
func (g *localGroup) exchange(ctx context.Context, rank int, b []byte) ([][]byte, error) {
	g.mu.Lock()
	if g.broken != nil {
		g.mu.Unlock()
		return nil, g.broken
	}
	r := g.cur
	r.data[rank] = b
	r.arrived++
	if r.arrived == g.n {
		close(r.done)
		g.cur = g.newRound()
	}
	g.mu.Unlock()
	select {
	case <-r.done:
		return r.data, nil
	case <-r.failed:
		return nil, r.err
	case <-ctx.Done():
		g.mu.Lock()
		defer g.mu.Unlock()
		select {
		case <-r.done: // completed while we were giving up
			return r.data, nil
		default:
		}
		if g.broken == nil {
			g.broken = fmt.Errorf("checkpoint: local group: rank %d left a collective: %w", rank, ctx.Err())
			r.err = g.broken
			close(r.failed)
		}
		return nil, g.broken
	}
}

type localRank struct {
	g    *localGroup
	rank int
}

func (l *localRank) Rank() int { return l.rank }
func (l *localRank) Size() int { return l.g.n }

func (l *localRank) GatherBytes(ctx context.Context, b []byte) ([][]byte, error) {
	all, err := l.g.exchange(ctx, l.rank, b)
	if err != nil || l.rank != 0 {
		return nil, err
	}
	return all, nil
}

func (l *localRank) BroadcastBytes(ctx context.Context, b []byte) ([]byte, error) {
	all, err := l.g.exchange(ctx, l.rank, b)
	if err != nil {
		return nil, err
	}
	return all[0], nil
}
