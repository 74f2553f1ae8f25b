package snapshot

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Offer is what one node brings to a round's agreement: where it stands in
// the new world and the complete snapshots in its directory. Every agent
// of the round sends its Offer to all the others (JSON).
type Offer struct {
	Node      string    // the node's id
	NodeRank  int       // its rank among the round's nodes
	FirstRank int       // the global rank of its first worker in the new world
	NProc     int       // its workers: global ranks [FirstRank, FirstRank+NProc)
	Replica   string    // host:port of its replica server; "" when it has none
	Holdings  []Holding // its complete snapshots (Scan)
	// Durable marks the offer of the job's durable directory (shared
	// storage, internal/snapshot/durable) rather than of a node: it hosts
	// no rank (NProc 0), and its holdings are a source only where no
	// node's holding of the same step is usable (a node's copy is cheaper).
	Durable bool `json:",omitempty"`
}

// Source is where one rank's snapshot of the agreed step is: the node that
// holds it, that node's replica server, and the rank whose slot it is
// (another rank's when the snapshot is replicated).
type Source struct {
	Node    string
	Replica string
	Rank    int
	Step    uint64
	Durable bool // the snapshot is in the durable directory (Node is that offer's)
}

// Plan is the outcome of an agreement: whether the new world restores, at
// which step, and from where; or, when it does not, why.
type Plan struct {
	Step    uint64
	Restore bool
	Reason  string         // when !Restore: why, in words for the job's log
	Sources map[int]Source // when Restore: a source for every rank in [0, world)
}

// candidate is a holding with the offer it came from.
type candidate struct {
	Holding
	offer *Offer
}

// Agree returns the plan for a new world of world ranks from every node's
// offer. It is pure: every agent given the same offers (in any order)
// computes the same plan.
//
// The step is the newest s at which every rank r in [0, world) has a
// holding usable by r: its own (Rank == r and World == world) or a
// Replicated one; the holdings of a Durable offer count as any node's.
// Rank r's source is, among those, preferably on a node rather than in the
// durable directory, then on the node that will host r, then one of rank
// r, then on the lowest node rank. When
// no step fits, Restore is false and Reason says why: no snapshot yet; the
// world changed and the snapshots are sharded; a rank whose snapshots no
// node of the round holds; no step every rank holds; or offers that do not
// lay out the world (ranks hosted twice or by none).
func Agree(offers []Offer, world int) Plan {
	byNode := slices.Clone(offers)
	sort.SliceStable(byNode, func(i, j int) bool { return byNode[i].NodeRank < byNode[j].NodeRank })
	if reason := checkLayout(byNode, world); reason != "" {
		return Plan{Reason: reason}
	}
	host := make(map[int]string, world) // rank -> node id
	var all []candidate
	for i := range byNode {
		o := &byNode[i]
		for r := o.FirstRank; r < o.FirstRank+o.NProc; r++ {
			host[r] = o.Node
		}
		for _, h := range o.Holdings {
			all = append(all, candidate{Holding: h, offer: o})
		}
	}
	if len(all) == 0 {
		return Plan{Reason: "no snapshot yet"}
	}
	usable := func(h Holding, r int) bool { return h.Replicated || (h.Rank == r && h.World == world) }

	// steps[r]: the steps rank r can restore.
	steps := make([]map[uint64]bool, world)
	for r := range steps {
		steps[r] = map[uint64]bool{}
	}
	anyUsable := false
	for _, c := range all {
		if c.Replicated {
			anyUsable = true
			for r := range steps {
				steps[r][c.Step] = true
			}
		} else if c.World == world && c.Rank < world {
			anyUsable = true
			steps[c.Rank][c.Step] = true
		}
	}
	if !anyUsable {
		newest := all[0]
		for _, c := range all {
			if c.Step > newest.Step {
				newest = c
			}
		}
		return Plan{Reason: fmt.Sprintf("the world changed from %d to %d and the snapshots are sharded: "+
			"restore at %d ranks or from your checkpoint", newest.World, world, newest.World)}
	}
	for r := range steps {
		if len(steps[r]) == 0 {
			return Plan{Reason: fmt.Sprintf("no node of this round holds a snapshot of rank %d "+
				"(the nodes that had it are gone)", r)}
		}
	}
	// The newest step every rank can restore.
	var common []uint64
	for s := range steps[0] {
		if all := func() bool {
			for r := 1; r < world; r++ {
				if !steps[r][s] {
					return false
				}
			}
			return true
		}(); all {
			common = append(common, s)
		}
	}
	if len(common) == 0 {
		return Plan{Reason: "no step that every rank holds: " + describe(steps)}
	}
	step := slices.Max(common)

	sources := make(map[int]Source, world)
	for r := range world {
		var best *candidate
		for i := range all {
			c := &all[i]
			if c.Step != step || !usable(c.Holding, r) {
				continue
			}
			if best == nil || prefer(*c, *best, r, host[r]) {
				best = c
			}
		}
		sources[r] = Source{Node: best.offer.Node, Replica: best.offer.Replica, Rank: best.Rank, Step: step, Durable: best.offer.Durable}
	}
	return Plan{Step: step, Restore: true, Sources: sources}
}

// prefer reports whether a is a better source than b for rank r, which
// node hostNode will host: on a node rather than in the durable directory,
// then on that node, then of rank r, then on the lower node rank, then of
// the lower rank.
func prefer(a, b candidate, r int, hostNode string) bool {
	if a.offer.Durable != b.offer.Durable {
		return !a.offer.Durable
	}
	if ah, bh := a.offer.Node == hostNode, b.offer.Node == hostNode; ah != bh {
		return ah
	}
	if ar, br := a.Rank == r, b.Rank == r; ar != br {
		return ar
	}
	if a.offer.NodeRank != b.offer.NodeRank {
		return a.offer.NodeRank < b.offer.NodeRank
	}
	return a.Rank < b.Rank
}

// checkLayout returns why offers (in node-rank order) do not lay out a
// world of world ranks, or "" when each rank has exactly one host.
func checkLayout(offers []Offer, world int) string {
	if world < 1 {
		return fmt.Sprintf("cannot agree on a world of %d ranks", world)
	}
	hosted := make([]string, world)
	for _, o := range offers {
		if o.NProc < 0 || o.FirstRank < 0 || o.FirstRank+o.NProc > world {
			return fmt.Sprintf("node %s offers ranks [%d, %d), outside the world of %d",
				o.Node, o.FirstRank, o.FirstRank+o.NProc, world)
		}
		for r := o.FirstRank; r < o.FirstRank+o.NProc; r++ {
			if hosted[r] != "" {
				return fmt.Sprintf("rank %d is offered by nodes %s and %s", r, hosted[r], o.Node)
			}
			hosted[r] = o.Node
		}
	}
	for r, n := range hosted {
		if n == "" {
			return fmt.Sprintf("no node offers to host rank %d of %d", r, world)
		}
	}
	return ""
}

// describe lists the steps each rank can restore, for a reason: "rank 0
// has 5, 6; rank 1 has 4" (at most 8 ranks and the 8 newest steps of each).
func describe(steps []map[uint64]bool) string {
	const most = 8
	parts := make([]string, min(len(steps), most))
	for r, set := range steps[:len(parts)] {
		var s []uint64
		for k := range set {
			s = append(s, k)
		}
		slices.Sort(s)
		if len(s) > 8 {
			s = s[len(s)-8:]
		}
		nums := make([]string, len(s))
		for i, v := range s {
			nums[i] = fmt.Sprint(v)
		}
		parts[r] = fmt.Sprintf("rank %d has %s", r, strings.Join(nums, ", "))
	}
	if len(steps) > most {
		parts = append(parts, fmt.Sprintf("and %d more ranks", len(steps)-most))
	}
	return strings.Join(parts, "; ")
}
