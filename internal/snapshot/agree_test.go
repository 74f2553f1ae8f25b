package snapshot

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// own returns the sharded holdings of ranks at step in a world of world.
func own(world int, step uint64, ranks ...int) []Holding {
	var hs []Holding
	for _, r := range ranks {
		hs = append(hs, Holding{Rank: r, World: world, Step: step})
	}
	return hs
}

// repl returns replicated holdings of ranks at step in a world of world.
func repl(world int, step uint64, ranks ...int) []Holding {
	hs := own(world, step, ranks...)
	for i := range hs {
		hs[i].Replicated = true
	}
	return hs
}

func cat(hs ...[]Holding) []Holding {
	var out []Holding
	for _, h := range hs {
		out = append(out, h...)
	}
	return out
}

// node returns the offer of node name (node rank nodeRank) hosting nproc
// ranks from first.
func node(name string, nodeRank, first, nproc int, hs ...Holding) Offer {
	return Offer{Node: name, NodeRank: nodeRank, FirstRank: first, NProc: nproc, Replica: name + ":7000", Holdings: hs}
}

// src is the Source of rank on node name.
func src(name string, rank int, step uint64) Source {
	return Source{Node: name, Replica: name + ":7000", Rank: rank, Step: step}
}

// durable returns the offer of the job's durable directory, after the
// nodes' numNodes offers.
func durable(numNodes int, hs ...Holding) Offer {
	return Offer{Node: "durable", NodeRank: numNodes, Durable: true, Holdings: hs}
}

// dsrc is the Source of rank in the durable directory.
func dsrc(rank int, step uint64) Source {
	return Source{Node: "durable", Rank: rank, Step: step, Durable: true}
}

func TestAgree(t *testing.T) {
	tests := []struct {
		name   string
		offers []Offer
		world  int
		want   Plan
	}{
		{
			name: "every rank at s, each on its own node",
			offers: []Offer{
				node("a", 0, 0, 2, cat(own(4, 6, 0, 1), own(4, 7, 0, 1))...),
				node("b", 1, 2, 2, cat(own(4, 6, 2, 3), own(4, 7, 2, 3))...),
			},
			world: 4,
			want: Plan{Step: 7, Restore: true, Sources: map[int]Source{
				0: src("a", 0, 7), 1: src("a", 1, 7), 2: src("b", 2, 7), 3: src("b", 3, 7)}},
		},
		{
			name: "two nodes lost: the durable directory's older step, from it for their ranks alone",
			offers: []Offer{
				node("a", 0, 0, 2, cat(own(4, 100, 0, 1), own(4, 130, 0, 1), own(4, 131, 0, 1))...),
				node("new", 1, 2, 2),
				durable(2, cat(own(4, 100, 0, 1, 2, 3), own(4, 50, 0, 1, 2, 3))...),
			},
			world: 4,
			want: Plan{Step: 100, Restore: true, Sources: map[int]Source{
				0: src("a", 0, 100), 1: src("a", 1, 100), 2: dsrc(2, 100), 3: dsrc(3, 100)}},
		},
		{
			name: "a node's replicated copy at the durable step beats the durable file of the rank itself",
			offers: []Offer{
				node("a", 0, 0, 1, repl(2, 100, 0)...),
				node("new", 1, 1, 1),
				durable(2, repl(2, 100, 0, 1)...),
			},
			world: 2,
			want:  Plan{Step: 100, Restore: true, Sources: map[int]Source{0: src("a", 0, 100), 1: src("a", 0, 100)}},
		},
		{
			name: "the nodes' newer common step wins over the durable directory",
			offers: []Offer{
				node("a", 0, 0, 1, own(2, 131, 0)...),
				node("b", 1, 1, 1, own(2, 131, 1)...),
				durable(2, own(2, 100, 0, 1)...),
			},
			world: 2,
			want:  Plan{Step: 131, Restore: true, Sources: map[int]Source{0: src("a", 0, 131), 1: src("b", 1, 131)}},
		},
		{
			name: "one rank's save cut short at s: everyone goes back to s-1",
			offers: []Offer{
				node("a", 0, 0, 2, cat(own(4, 6, 0, 1), own(4, 7, 0, 1))...),
				node("b", 1, 2, 2, cat(own(4, 6, 2, 3), own(4, 7, 2))...),
			},
			world: 4,
			want: Plan{Step: 6, Restore: true, Sources: map[int]Source{
				0: src("a", 0, 6), 1: src("a", 1, 6), 2: src("b", 2, 6), 3: src("b", 3, 6)}},
		},
		{
			name: "a rank with no step in common",
			offers: []Offer{
				node("a", 0, 0, 1, own(2, 5, 0)...),
				node("b", 1, 1, 1, cat(own(2, 3, 1), own(2, 4, 1))...),
			},
			world: 2,
			want:  Plan{Reason: "no step that every rank holds: rank 0 has 5; rank 1 has 3, 4"},
		},
		{
			name: "node c lost; its ranks have replicas on a: the sources point at a",
			offers: []Offer{
				// The new world puts c's old ranks 4 and 5 on a and b.
				node("a", 0, 0, 3, cat(own(6, 9, 0, 1), own(6, 9, 4, 5))...),
				node("b", 1, 3, 3, cat(own(6, 9, 2, 3), own(6, 9, 0, 1))...),
			},
			world: 6,
			want: Plan{Step: 9, Restore: true, Sources: map[int]Source{
				0: src("a", 0, 9), 1: src("a", 1, 9), 2: src("b", 2, 9),
				3: src("b", 3, 9), 4: src("a", 4, 9), 5: src("a", 5, 9)}},
		},
		{
			name: "node c lost with no replica of its ranks",
			offers: []Offer{
				node("a", 0, 0, 3, own(6, 9, 0, 1)...),
				node("b", 1, 3, 3, own(6, 9, 2, 3)...),
			},
			world: 6,
			want:  Plan{Reason: "no node of this round holds a snapshot of rank 4 (the nodes that had it are gone)"},
		},
		{
			name: "the world changed and the snapshots are sharded: refused",
			offers: []Offer{
				node("a", 0, 0, 2, own(6, 9, 0, 1)...),
				node("b", 1, 2, 2, own(6, 9, 2, 3)...),
			},
			world: 4,
			want:  Plan{Reason: "the world changed from 6 to 4 and the snapshots are sharded: restore at 6 ranks or from your checkpoint"},
		},
		{
			name: "the world changed, replicated: every new rank has a source, its own node's first",
			offers: []Offer{
				node("a", 0, 0, 2, repl(6, 9, 0, 1)...),
				node("b", 1, 2, 1),                      // holds nothing
				node("c", 2, 3, 1, repl(6, 9, 4, 5)...), // a replica of the lost node's ranks 4, 5
			},
			world: 4,
			want: Plan{Step: 9, Restore: true, Sources: map[int]Source{
				0: src("a", 0, 9), 1: src("a", 1, 9), 2: src("a", 0, 9), 3: src("c", 4, 9)}},
		},
		{
			name: "replicated: a stale newer step of one rank does not count",
			offers: []Offer{
				node("a", 0, 0, 2, cat(repl(2, 3, 0, 1), repl(2, 4, 0))...),
			},
			world: 2,
			want: Plan{Step: 4, Restore: true, Sources: map[int]Source{
				0: src("a", 0, 4), 1: src("a", 0, 4)}},
		},
		{
			name:   "no snapshot yet",
			offers: []Offer{node("a", 0, 0, 2), node("b", 1, 2, 2)},
			world:  4,
			want:   Plan{Reason: "no snapshot yet"},
		},
		{
			name:   "offers that leave a rank without a host",
			offers: []Offer{node("a", 0, 0, 2, own(3, 1, 0, 1)...)},
			world:  3,
			want:   Plan{Reason: "no node offers to host rank 2 of 3"},
		},
		{
			name:   "offers that host a rank twice",
			offers: []Offer{node("a", 0, 0, 2), node("b", 1, 1, 1)},
			world:  2,
			want:   Plan{Reason: "rank 1 is offered by nodes a and b"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, Agree(tt.offers, tt.world))
			// Pure and order-free: the offers in reverse give the same plan.
			rev := make([]Offer, len(tt.offers))
			for i, o := range tt.offers {
				rev[len(rev)-1-i] = o
			}
			require.Equal(t, tt.want, Agree(rev, tt.world))
		})
	}
}
