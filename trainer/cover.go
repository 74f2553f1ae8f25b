package trainer

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// offer is one holding a rank announces to an exchange: the state of
// elements [Lo, Hi) of the flat buffer after Step optimizer steps. Extra
// marks a copy kept elsewhere (a memory copy), used only when the ranks'
// own state does not cover the model.
type offer struct {
	Step   int64
	Lo, Hi int
	Extra  bool
}

// announcement is what one rank tells every other at the start of an
// exchange: the last step it completed (-1: it holds no live state), the
// round of the world whose run last set its live state (see decide), the
// slice [Lo, Hi) it owns under the new layout, and what it holds.
type announcement struct {
	Done   int64
	Round  int64
	Lo, Hi int
	Offers []offer
}

// piece is one range [Lo, Hi) of the new layout that rank Dst takes from
// its rank Src's offer number Offer (Src == Dst: a local copy).
type piece struct {
	Src, Dst, Lo, Hi, Offer int
}

// decision is what every rank of an exchange computes alike from the
// same announcements.
type decision struct {
	Source RecoverySource
	Step   int64
	Redone int
	Pieces []piece // by Dst, then Lo
}

// decide picks the highest step, at most the lowest step any rank of the
// running world completed, whose holdings cover elements [0, size) (the
// model; padding past it is zero), first without extra copies, then with
// them; and who sends what to whom. Each rank takes what it holds itself;
// every other range comes from a holder with the fewest elements to send
// so far (ties: the lowest rank), preferring live state over extra
// copies. No covered step: Source None, no pieces, and Redone counts
// from step 0 (the state as New made it).
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
// highest step decide may choose, a stale rank can never lower the choice
// below what the running world alone would choose. So the decision never
// goes below the newest step the running world completed and covers.
//
// Every rank computes the same decision: it depends only on the
// all-gathered announcements, which every rank holds alike, in rank
// order.
func decide(all []announcement, size int) decision {
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
			d := decision{Source: RecoveryPeers, Step: s, Redone: int(max(0, latest-s))}
			if withExtra {
				d.Source = RecoveryMemory
			}
			d.Pieces = assign(all, s, withExtra, size)
			return d
		}
	}
	return decision{Source: RecoveryNone, Redone: int(max(0, latest))}
}

// settle returns all as decide reads it, and the newest step a rank of
// the running world completed (-1: no rank holds live state). A stale
// rank (see decide) becomes one with no live state (Done -1) whose offers
// of a step other than the running world's cap are void (Step -1, never
// chosen), so that every offer keeps its index. all is not changed.
func settle(all []announcement) ([]announcement, int64) {
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
func usable(o offer, s int64, withExtra bool) bool {
	return o.Step == s && (withExtra || !o.Extra) && o.Hi > o.Lo
}

// covers says whether the offers usable for step s cover [0, size).
func covers(all []announcement, s int64, withExtra bool, size int) bool {
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
func assign(all []announcement, s int64, withExtra bool, size int) []piece {
	load := make([]int, len(all))
	var pieces []piece
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
			p := piece{Src: h.rank, Dst: dst, Lo: cuts[k], Hi: cuts[k+1], Offer: h.offer}
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
func pick(all []announcement, dst, lo, hi int, s int64, withExtra bool, load []int) holder {
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

// encode is a's wire form: little-endian int64 Done, Round, Lo, Hi and
// the number of offers, then Step, Lo, Hi and Extra (0 or 1) of each.
func (a announcement) encode() []byte {
	b := make([]byte, 0, 40+25*len(a.Offers))
	for _, x := range []int64{a.Done, a.Round, int64(a.Lo), int64(a.Hi), int64(len(a.Offers))} {
		b = binary.LittleEndian.AppendUint64(b, uint64(x))
	}
	for _, o := range a.Offers {
		for _, x := range []int64{o.Step, int64(o.Lo), int64(o.Hi)} {
			b = binary.LittleEndian.AppendUint64(b, uint64(x))
		}
		b = append(b, byte(b2i(o.Extra)))
	}
	return b
}

var errMalformed = errors.New("malformed announcement")

// decodeAnnouncement reads what encode wrote, checking every range.
func decodeAnnouncement(b []byte) (announcement, error) {
	next := func() int64 {
		if len(b) < 8 {
			b = nil
			return -2
		}
		x := int64(binary.LittleEndian.Uint64(b))
		b = b[8:]
		return x
	}
	var a announcement
	a.Done, a.Round, a.Lo, a.Hi = next(), next(), int(next()), int(next())
	n := next()
	if a.Done < -1 || a.Round < 0 || a.Lo < 0 || a.Hi < a.Lo || n < 0 || n > int64(len(b))/25 || int64(len(b)) != 25*n {
		return announcement{}, errMalformed
	}
	for range n {
		o := offer{Step: next(), Lo: int(next()), Hi: int(next()), Extra: b[0] == 1}
		if o.Step < 0 || o.Lo < 0 || o.Hi < o.Lo || b[0] > 1 {
			return announcement{}, fmt.Errorf("%w: offer of step %d, [%d, %d)", errMalformed, o.Step, o.Lo, o.Hi)
		}
		b = b[1:]
		a.Offers = append(a.Offers, o)
	}
	return a, nil
}
