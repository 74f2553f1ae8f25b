package recovery

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Source says where the ranks found the state they go on from.
type Source int

const (
	// None: no step was held in full; the ranks start as new (the caller
	// resumes from a checkpoint, or the seed).
	None Source = iota
	// Peers: the ranks' own state covered the model: live, or saved by a
	// rank's previous process (see Announcement).
	Peers
	// Memory: the extra offers (memory copies) were needed.
	Memory
)

// String names the source: none, peers or memory.
func (s Source) String() string {
	switch s {
	case None:
		return "none"
	case Peers:
		return "peers"
	case Memory:
		return "memory"
	}
	return fmt.Sprintf("Source(%d)", int(s))
}

// Offer is one Slice a rank announces, without its data. Extra marks a
// copy kept for another rank (a memory copy), used only when the ranks'
// own state does not cover the model.
type Offer struct {
	Step   int64
	Lo, Hi int
	Extra  bool
}

// Announcement is what one rank tells every other at the start of an
// exchange: the last step it completed (-1: it holds no live state; its
// offers may still be its own state, saved before its process restarted),
// the round of the world whose run last set its live state (see Decide),
// the slice [Lo, Hi) it owns under the new layout, and what it holds.
type Announcement struct {
	Done   int64
	Round  int64
	Lo, Hi int
	Offers []Offer
}

// Announce is the Announcement of a rank that completed step done (-1:
// none) in round round, owns [lo, hi) of the new layout and holds own
// (its live state and rollback copy) and extra (memory copies): an Offer
// of each, own first, in order, so that Offer number i is
// slices.Concat(own, extra)[i]. It reads only the slices' steps and
// ranges.
func Announce(done, round int64, lo, hi int, own, extra []Slice) Announcement {
	a := Announcement{Done: done, Round: round, Lo: lo, Hi: hi, Offers: make([]Offer, 0, len(own)+len(extra))}
	for _, s := range own {
		a.Offers = append(a.Offers, Offer{Step: s.Step, Lo: s.Lo, Hi: s.Hi})
	}
	for _, s := range extra {
		a.Offers = append(a.Offers, Offer{Step: s.Step, Lo: s.Lo, Hi: s.Hi, Extra: true})
	}
	return a
}

// Piece is one range [Lo, Hi) of the new layout that rank Dst takes from
// rank Src's offer number Offer (Src == Dst: a local copy).
type Piece struct {
	Src, Dst, Lo, Hi, Offer int
}

// Decision is what every rank of an exchange computes alike from the
// same announcements (see Decide).
type Decision struct {
	Source Source
	// Step is the step every rank goes on after (0 with None).
	Step int64
	// Redone is the number of completed steps thrown away: the newest step
	// a rank of the running world completed, minus Step (with None, from
	// step 0).
	Redone int
	// Pieces are what moves, by Dst, then Lo.
	Pieces []Piece
}

// Decide picks the highest step, at most the lowest step any rank of the
// running world completed, whose offers cover elements [0, size) (the
// model; padding past it is zero), first without extra offers, then with
// them; and who sends what to whom. Each rank takes what it holds itself;
// every other range comes from a holder with the fewest elements to send
// so far (ties: the lowest rank), preferring live state over extra
// copies. No covered step: Source None, no pieces, and Redone counts
// from step 0 (the state as new).
//
// The running world is the ranks with live state whose Round is the
// newest Round of any rank with live state; the others are stale. A rank
// is stale when a world it was not in ran after its own: a node cut off
// by a partition whose lease expired, rejoining with its old workers
// after the others went on in a new round. Its state is behind theirs,
// so it decides nothing: it does not cap the step (else it would pull
// every rank back to its old step and throw the running world's steps
// away), it does not count in Redone, and it takes its new slice from the
// holders as a fresh rank does. Its offers of exactly the running world's
// cap serve like anyone's, and no other: a holding of step s is the same
// bits whichever world computed it (the trainer's invariant: any layout
// gives the same bits as one process), and offering only the cap, the
// highest step Decide may choose, a stale rank can never lower the choice
// below what the running world alone would choose. So the decision never
// goes below the newest step the running world completed and covers.
//
// Decide is a pure function of all (indexed by rank) and size: every rank
// that all-gathered the same announcements computes the same Decision. It
// does not change all.
func Decide(all []Announcement, size int) Decision {
	all, latest := settle(all)
	limit := int64(math.MaxInt64)
	for _, a := range all {
		if a.Done >= 0 {
			limit = min(limit, a.Done)
		}
	}
	var steps []int64
	for _, a := range all {
		for _, o := range a.Offers {
			if o.Step >= 0 && o.Step <= limit {
				steps = append(steps, o.Step)
			}
		}
	}
	slices.Sort(steps)
	steps = slices.Compact(steps)
	for i := len(steps) - 1; i >= 0; i-- {
		s := steps[i]
		for _, withExtra := range []bool{false, true} {
			if !covers(all, s, withExtra, size) {
				continue
			}
			d := Decision{Source: Peers, Step: s, Redone: int(max(0, latest-s))}
			if withExtra {
				d.Source = Memory
			}
			d.Pieces = assign(all, s, withExtra, size)
			return d
		}
	}
	return Decision{Source: None, Redone: int(max(0, latest))}
}

// settle returns all as Decide reads it, and the newest step a rank of
// the running world completed (-1: no rank holds live state). A stale
// rank (see Decide) becomes one with no live state (Done -1) whose offers
// of a step other than the running world's cap are void (Step -1, never
// chosen), so that every offer keeps its index. all is not changed.
func settle(all []Announcement) ([]Announcement, int64) {
	newest := int64(-1)
	for _, a := range all {
		if a.Done >= 0 {
			newest = max(newest, a.Round)
		}
	}
	limit, latest := int64(math.MaxInt64), int64(-1)
	for _, a := range all {
		if a.Done >= 0 && a.Round == newest {
			limit, latest = min(limit, a.Done), max(latest, a.Done)
		}
	}
	out := slices.Clone(all)
	for r, a := range out {
		if a.Done < 0 || a.Round == newest {
			continue
		}
		out[r].Done = -1
		out[r].Offers = slices.Clone(a.Offers)
		for i, o := range a.Offers {
			if o.Step != limit {
				out[r].Offers[i].Step = -1
			}
		}
	}
	return out, latest
}

// usable says whether o may serve step s.
func usable(o Offer, s int64, withExtra bool) bool {
	return o.Step == s && (withExtra || !o.Extra) && o.Hi > o.Lo
}

// covers says whether the offers usable for step s cover [0, size).
func covers(all []Announcement, s int64, withExtra bool, size int) bool {
	var spans [][2]int
	for _, a := range all {
		for _, o := range a.Offers {
			if usable(o, s, withExtra) {
				spans = append(spans, [2]int{o.Lo, o.Hi})
			}
		}
	}
	slices.SortFunc(spans, func(a, b [2]int) int { return cmp.Compare(a[0], b[0]) })
	reach := 0
	for _, sp := range spans {
		if sp[0] > reach {
			break
		}
		reach = max(reach, sp[1])
	}
	return reach >= size
}

// holder is one usable offer: rank and offer index.
type holder struct{ rank, offer int }

// assign deals out the ranges every rank needs at step s (which the
// usable offers cover).
func assign(all []Announcement, s int64, withExtra bool, size int) []Piece {
	load := make([]int, len(all))
	var pieces []Piece
	for dst, a := range all {
		lo, hi := a.Lo, min(a.Hi, size)
		if lo >= hi {
			continue
		}
		cuts := []int{lo, hi}
		for _, b := range all {
			for _, o := range b.Offers {
				if usable(o, s, withExtra) {
					cuts = append(cuts, clamp(o.Lo, lo, hi), clamp(o.Hi, lo, hi))
				}
			}
		}
		slices.Sort(cuts)
		cuts = slices.Compact(cuts)
		for k := 0; k+1 < len(cuts); k++ {
			h := pick(all, dst, cuts[k], cuts[k+1], s, withExtra, load)
			if h.rank != dst {
				load[h.rank] += cuts[k+1] - cuts[k]
			}
			p := Piece{Src: h.rank, Dst: dst, Lo: cuts[k], Hi: cuts[k+1], Offer: h.offer}
			if n := len(pieces); n > 0 && pieces[n-1].Dst == dst && pieces[n-1].Src == p.Src &&
				pieces[n-1].Offer == p.Offer && pieces[n-1].Hi == p.Lo {
				pieces[n-1].Hi = p.Hi
				continue
			}
			pieces = append(pieces, p)
		}
	}
	return pieces
}

func clamp(x, lo, hi int) int { return min(max(x, lo), hi) }

// pick chooses who gives dst the range [lo, hi), which lies inside one
// usable offer or more: dst itself if it holds it (live state first),
// else the least loaded rank holding it as live state, else as an extra
// copy.
func pick(all []Announcement, dst, lo, hi int, s int64, withExtra bool, load []int) holder {
	var own, live, extra []holder
	for r, a := range all {
		for i, o := range a.Offers {
			if !usable(o, s, withExtra) || o.Lo > lo || o.Hi < hi {
				continue
			}
			h := holder{r, i}
			switch {
			case r == dst:
				own = append(own, h)
			case !o.Extra:
				live = append(live, h)
			default:
				extra = append(extra, h)
			}
		}
	}
	if len(own) > 0 {
		slices.SortStableFunc(own, func(a, b holder) int {
			return cmp.Compare(b2i(all[dst].Offers[a.offer].Extra), b2i(all[dst].Offers[b.offer].Extra))
		})
		return own[0]
	}
	cands := live
	if len(cands) == 0 {
		cands = extra
	}
	best := cands[0]
	for _, h := range cands[1:] {
		if load[h.rank] < load[best.rank] {
			best = h
		}
	}
	return best
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Pairs lists the pairs of distinct ranks that d's pieces move between,
// lowest rank first, in increasing order: the one global order in which
// every rank makes its two-rank groups.
func (d Decision) Pairs() [][2]int {
	seen := map[[2]int]bool{}
	var pairs [][2]int
	for _, p := range d.Pieces {
		if p.Src == p.Dst {
			continue
		}
		k := [2]int{min(p.Src, p.Dst), max(p.Src, p.Dst)}
		if !seen[k] {
			seen[k] = true
			pairs = append(pairs, k)
		}
	}
	slices.SortFunc(pairs, func(a, b [2]int) int { return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1])) })
	return pairs
}

// Between returns the pieces src sends dst, in d's order.
func (d Decision) Between(src, dst int) []Piece {
	var out []Piece
	for _, p := range d.Pieces {
		if p.Src == src && p.Dst == dst {
			out = append(out, p)
		}
	}
	return out
}
