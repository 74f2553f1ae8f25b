package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// Exchanged is one node's part of a round's Exchange, as etcd holds it.
type Exchanged struct {
	NodeRank int    `json:"node_rank"` // the node's rank in the round: its place in the result
	Value    []byte `json:"value"`
}

// ErrRoundEnded says the round ended (another round opened, or the job
// closed) before every node of it took part in an Exchange.
var ErrRoundEnded = errors.New("rendezvous: the round ended")

// Exchange is an all-gather among the nodes of round r, which this node
// runs in: it puts value as this node's (under rounds/<r>/exchange/<node
// id>, leased by this agent's session, replacing its part of the round
// before) and returns every node's value in node-rank order once all
// r.NumNodes nodes put theirs. It fails, wrapping ErrRoundEnded and
// saying how many nodes took part, as soon as the round ends first, and
// with ctx's cause when ctx ends. Each node reads the exchange with one
// list and one watch of its keys.
func (e *Elastic) Exchange(ctx context.Context, r Round, value []byte) ([][]byte, error) {
	if r.NumNodes < 1 || r.NodeRank < 0 || r.NodeRank >= r.NumNodes {
		return nil, fmt.Errorf("rendezvous: exchange in round %d: node rank %d of %d nodes", r.Number, r.NodeRank, r.NumNodes)
	}
	if err := e.put(ctx, exchangeKey(r.Number, e.cfg.Self.ID), Exchanged{NodeRank: r.NodeRank, Value: value}, true); err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, fmt.Errorf("rendezvous: exchange in round %d: %w", r.Number, err)
	}
	if e.exchanged >= 0 && e.exchanged != r.Number {
		_ = e.store.Delete(ctx, exchangeKey(e.exchanged, e.cfg.Self.ID)) // leased anyway: it goes with the session
	}
	e.exchanged = r.Number
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	prefix := exchangePrefix(r.Number)
	parts := map[string]Exchanged{}
	var events <-chan Event
	for {
		if events == nil {
			kvs, rev, err := e.store.List(ctx, prefix, 0)
			if err != nil && ctx.Err() != nil {
				return nil, context.Cause(ctx)
			}
			if err != nil {
				return nil, fmt.Errorf("rendezvous: exchange in round %d: %w", r.Number, err)
			}
			clear(parts)
			for _, kv := range kvs {
				parts = applyExchanged(parts, Event{KV: kv})
			}
			events = e.store.Watch(wctx, prefix, rev)
		}
		if len(parts) >= r.NumNodes {
			return inNodeRankOrder(parts, r)
		}
		snap, changed := e.agent.read()
		if _, over := roundOver(snap.state, r); over {
			return nil, fmt.Errorf("%w before every node took part in its exchange: %d of %d did (round %d)", ErrRoundEnded, len(parts), r.NumNodes, r.Number)
		}
		select {
		case ev, ok := <-events:
			if !ok {
				events = nil // broken: list again
				continue
			}
			parts = applyExchanged(parts, ev)
		case <-changed:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// applyExchanged applies one change of an exchange key to parts (by node
// id); a key or value that is not an exchange's is skipped.
func applyExchanged(parts map[string]Exchanged, ev Event) map[string]Exchanged {
	k, ok := ParseKey(ev.Key)
	if !ok || k.Kind != KindExchange {
		return parts
	}
	if ev.Deleted {
		delete(parts, k.ID)
		return parts
	}
	var x Exchanged
	if json.Unmarshal(ev.Value, &x) == nil {
		parts[k.ID] = x
	}
	return parts
}

// inNodeRankOrder is the values of parts by node rank, which must be
// exactly 0 .. r.NumNodes-1.
func inNodeRankOrder(parts map[string]Exchanged, r Round) ([][]byte, error) {
	out := make([][]byte, r.NumNodes)
	seen := make([]string, r.NumNodes)
	for id, x := range parts {
		if x.NodeRank < 0 || x.NodeRank >= r.NumNodes || seen[x.NodeRank] != "" {
			return nil, fmt.Errorf("rendezvous: exchange in round %d: node %s put node rank %d, which is outside the round's %d nodes or another's (%q)",
				r.Number, id, x.NodeRank, r.NumNodes, seen[max(0, min(x.NodeRank, r.NumNodes-1))])
		}
		seen[x.NodeRank], out[x.NodeRank] = id, x.Value
	}
	return out, nil
}

// ErrNoExchange says the nodes of a round share no store to exchange
// values through: a static launch of several nodes.
var ErrNoExchange = errors.New("rendezvous: the nodes of a static launch share no store to exchange values through (the etcd rendezvous, --rdzv-backend=etcd, has one)")

// Exchange returns value alone for a static job of one node; with more,
// it fails with ErrNoExchange: static nodes share nothing.
func (s *Static) Exchange(ctx context.Context, r Round, value []byte) ([][]byte, error) {
	if r.NumNodes != 1 {
		return nil, fmt.Errorf("%w (%d nodes)", ErrNoExchange, r.NumNodes)
	}
	return [][]byte{value}, ctx.Err()
}
