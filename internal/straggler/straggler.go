// Package straggler names the ranks of a job that compute slower than
// their peers, from the per-step compute times the workers report on
// their heartbeats (see heartbeat.Progress.ComputeS).
//
// Each agent keeps a short window of compute times per local rank
// (Window, Tracker), publishes its ranks' medians as one small Report per
// node, and any reader of every node's Report (an agent, gorun status)
// names the ranks whose median is at least Factor times the median of
// their peers' (Find).
package straggler

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"

	"github.com/gorun/gorun/internal/heartbeat"
)

// WindowSize is how many of the latest steps a Window keeps.
const WindowSize = 10

// Factor is how many times its peers' median step compute a rank's
// median must reach to be named a straggler.
const Factor = 1.5

// Window is the compute times of a rank's latest WindowSize steps. The
// zero Window is empty and ready to use; it is not safe for concurrent
// use.
type Window struct {
	times [WindowSize]float64
	n     int // times recorded, ever
}

// Add records one step's compute time in seconds; NaN, infinite and
// negative times (not reported, or nonsense) are ignored.
func (w *Window) Add(seconds float64) {
	if math.IsNaN(seconds) || math.IsInf(seconds, 0) || seconds < 0 {
		return
	}
	w.times[w.n%WindowSize] = seconds
	w.n++
}

// Median is the median of the recorded times, NaN when there are none.
func (w *Window) Median() float64 {
	return median(slices.Clone(w.times[:min(w.n, WindowSize)]))
}

// median sorts xs and returns their median, NaN for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	sort.Float64s(xs)
	mid := len(xs) / 2
	if len(xs)%2 == 1 {
		return xs[mid]
	}
	return (xs[mid-1] + xs[mid]) / 2
}

// RankCompute is one rank's median step compute time.
type RankCompute struct {
	Rank     int     `json:"rank"`
	ComputeS float64 `json:"compute_s"`
}

// Report is what one node publishes: the median compute of each of its
// ranks that reported one, and each rank's latest figures (for gorun
// status; a report of an older agent has none).
type Report struct {
	Node     string         `json:"node"`
	Ranks    []RankCompute  `json:"ranks"`
	Progress []RankProgress `json:"progress,omitempty"`
}

// RankProgress is the latest heartbeat figures of one rank: the step it
// finished, that step's loss and the job's tokens per second. A figure
// the worker did not report is left out (0 in Go).
type RankProgress struct {
	Rank       int     `json:"rank"`
	Step       int     `json:"step"`
	Loss       float64 `json:"loss,omitempty"`
	TokensPerS float64 `json:"tokens_per_s,omitempty"`
}

// Latest is the figures of the rank that finished the newest step (the
// lowest such rank), and false when there are none.
func (r Report) Latest() (RankProgress, bool) {
	var best RankProgress
	found := false
	for _, p := range r.Progress {
		if !found || p.Step > best.Step || p.Step == best.Step && p.Rank < best.Rank {
			best, found = p, true
		}
	}
	return best, found
}

// ParseReport decodes a Report as Encode wrote it; an error names what
// is wrong.
func ParseReport(b []byte) (Report, error) {
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return Report{}, fmt.Errorf("straggler: report: %w", err)
	}
	return r, nil
}

// Encode is r as the compact JSON a node publishes.
func (r Report) Encode() []byte {
	b, _ := json.Marshal(r) // a struct of ints, floats and strings always marshals
	return b
}

// Straggler is a rank whose median step compute is Ratio times its peers'.
type Straggler struct {
	Rank  int
	Node  string
	Ratio float64
}

// String says it as an operator reads it, e.g. "rank 3 on node-b, 1.9x
// the median step compute" (of the other ranks).
func (s Straggler) String() string {
	return fmt.Sprintf("rank %d on %s, %.1fx the median step compute", s.Rank, s.Node, s.Ratio)
}

// Find names the ranks of reports whose median compute is at least
// Factor times the median of their peers' (every other rank's), so that
// one slow rank stands out even in a job of two; it needs at least two
// ranks, and returns them by rank.
func Find(reports []Report) []Straggler {
	type ranked struct {
		RankCompute
		node string
	}
	var all []ranked
	for _, r := range reports {
		for _, rc := range r.Ranks {
			all = append(all, ranked{rc, r.Node})
		}
	}
	if len(all) < 2 {
		return nil
	}
	sort.Slice(all, func(i, j int) bool { return all[i].ComputeS < all[j].ComputeS })
	sorted := make([]float64, len(all))
	for i, r := range all {
		sorted[i] = r.ComputeS
	}
	var out []Straggler
	for i, r := range all {
		peers := medianWithout(sorted, i)
		if !(peers > 0) {
			continue
		}
		if ratio := r.ComputeS / peers; ratio >= Factor {
			out = append(out, Straggler{Rank: r.Rank, Node: r.node, Ratio: ratio})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rank < out[j].Rank })
	return out
}

// medianWithout is the median of sorted (ascending, at least two
// values) without its element at index skip.
func medianWithout(sorted []float64, skip int) float64 {
	at := func(k int) float64 { // k-th value of the rest
		if k >= skip {
			k++
		}
		return sorted[k]
	}
	n := len(sorted) - 1
	if n%2 == 1 {
		return at(n / 2)
	}
	return (at(n/2-1) + at(n/2)) / 2
}

// Tracker keeps a Window per local rank of this node's workers. It is
// safe for concurrent use.
type Tracker struct {
	mu    sync.Mutex
	ranks map[int]*tracked // by local rank
}

type tracked struct {
	rank   int
	window Window
	latest *RankProgress // the last heartbeat's figures; nil before the first
}

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker { return &Tracker{ranks: map[int]*tracked{}} }

// Started forgets what local rank's previous worker reported: the new
// worker has global rank rank.
func (t *Tracker) Started(localRank, rank int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ranks[localRank] = &tracked{rank: rank}
}

// Observe records one heartbeat of the worker of localRank with global
// rank rank: its step compute time and its step, loss and
// tokens per second, which Report carries. A heartbeat of a worker that is
// no longer its local rank's (an older round's) is ignored.
func (t *Tracker) Observe(localRank, rank int, p heartbeat.Progress) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tr := t.ranks[localRank]
	if tr == nil || tr.rank != rank {
		return
	}
	tr.window.Add(p.ComputeS)
	finite := func(v float64) float64 {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return 0
		}
		return v
	}
	tr.latest = &RankProgress{Rank: rank, Step: p.Step, Loss: finite(p.Loss), TokensPerS: finite(p.TokensPerS)}
}

// Report is this node's ranks' median compute, by rank, and their latest
// figures (see Observe); ranks with no time yet are left out of Ranks,
// ranks with no heartbeat yet out of Progress.
func (t *Tracker) Report(node string) Report {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := Report{Node: node, Ranks: []RankCompute{}}
	for _, tr := range t.ranks {
		if m := tr.window.Median(); !math.IsNaN(m) {
			r.Ranks = append(r.Ranks, RankCompute{Rank: tr.rank, ComputeS: m})
		}
		if tr.latest != nil {
			r.Progress = append(r.Progress, *tr.latest)
		}
	}
	sort.Slice(r.Ranks, func(i, j int) bool { return r.Ranks[i].Rank < r.Ranks[j].Rank })
	sort.Slice(r.Progress, func(i, j int) bool { return r.Progress[i].Rank < r.Progress[j].Rank })
	return r
}
