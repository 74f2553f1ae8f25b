package agentmetrics

import (
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorun/gorun/internal/goodput"
	"github.com/gorun/gorun/rendezvous"
)

// goodputRecorder feeds the agent's events to a goodput.Tally: the steps
// of one worker (the lowest local rank that reports steps: every rank of
// a world makes the same steps), the agent leaving its round, why it
// ended, the next round formed. It is safe for concurrent use, and a
// prometheus.Collector of gorun_goodput_ratio,
// gorun_time_lost_seconds_total and gorun_steps_redone_total.
type goodputRecorder struct {
	now    func() time.Time
	labels prometheus.Labels

	mu        sync.Mutex
	tally     goodput.Tally
	localRank int // the local rank followed; -1: none yet
}

func newGoodputRecorder(now func() time.Time) *goodputRecorder {
	return &goodputRecorder{now: now, localRank: -1}
}

func (g *goodputRecorder) apply(e goodput.Event) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.tally = g.tally.Apply(e)
}

// leftRound: the agent left the round it trained in (not for the job's end).
func (g *goodputRecorder) leftRound() { g.apply(goodput.Event{Kind: goodput.Left, At: g.now()}) }

// roundFormed: the next round formed on this node.
func (g *goodputRecorder) roundFormed() { g.apply(goodput.Event{Kind: goodput.Formed, At: g.now()}) }

// roundEnded: the agent learned why its round ended.
func (g *goodputRecorder) roundEnded(end rendezvous.End) {
	g.apply(goodput.Event{Kind: goodput.Ended, At: g.now(), Cause: causeOf(end)})
}

// step: the worker of localRank finished a step; redone and stateS are
// its heartbeat's (NaN: not reported).
func (g *goodputRecorder) step(localRank int, redone, stateS float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.localRank < 0 || localRank < g.localRank {
		g.localRank = localRank
	}
	if localRank != g.localRank {
		return
	}
	g.tally = g.tally.Apply(goodput.Event{Kind: goodput.Step, At: g.now(), Redone: redone, StateS: stateS})
}

// summary is the figures now.
func (g *goodputRecorder) summary() goodput.Summary {
	g.mu.Lock()
	t := g.tally
	g.mu.Unlock()
	return t.Summary(g.now())
}

// causeOf is what a recovery after end is charged to: a worker failure,
// else a membership change by its kind, told by the reason the
// rendezvous wrote (package rendezvous: "evicted" by evict.go, "left
// out" by reach.go).
func causeOf(end rendezvous.End) goodput.Cause {
	switch {
	case end.Cause == rendezvous.CauseFailure:
		return goodput.Worker
	case end.Grow:
		return goodput.Restart
	case strings.Contains(end.Reason, " evicted"):
		return goodput.Straggler
	case strings.Contains(end.Reason, " left out"):
		return goodput.Network
	case len(end.Lost) > 0 || strings.Contains(end.Reason, " left"):
		return goodput.Node
	}
	return goodput.Restart
}

var (
	ratioDesc = prometheus.NewDesc("gorun_goodput_ratio",
		"Effective training time over the time since this node's first step: the time between consecutive steps of one worker, less the redone steps' time; NaN before the first step (internal/goodput).",
		nil, nil)
	lostDesc = prometheus.NewDesc("gorun_time_lost_seconds_total",
		"Training time this node lost to recoveries, by cause (worker, node, network, straggler, restart) and phase: detection (last step to the agent leaving its round), rendezvous (to the next round formed), state_transfer (the worker's restore of its state, from peers or a checkpoint), first_step (the rest, to the first step after it), redone_steps (steps thrown away x the median step time). Added when the recovery's first step ends (internal/goodput).",
		[]string{"cause", "phase"}, nil)
	redoneDesc = prometheus.NewDesc("gorun_steps_redone_total",
		"Completed steps the recoveries this node went through threw away, as its workers reported them.", nil, nil)
)

// Describe is prometheus.Collector's.
func (g *goodputRecorder) Describe(ch chan<- *prometheus.Desc) {
	ch <- ratioDesc
	ch <- lostDesc
	ch <- redoneDesc
}

// Collect is prometheus.Collector's: the figures at the scrape.
func (g *goodputRecorder) Collect(ch chan<- prometheus.Metric) {
	s := g.summary()
	ratio := s.Ratio
	if !s.Measured {
		ratio = nan
	}
	ch <- prometheus.MustNewConstMetric(ratioDesc, prometheus.GaugeValue, ratio)
	for _, c := range goodput.Causes {
		for _, p := range goodput.Phases {
			ch <- prometheus.MustNewConstMetric(lostDesc, prometheus.CounterValue, s.Lost[c.String()][p.String()], c.String(), p.String())
		}
	}
	ch <- prometheus.MustNewConstMetric(redoneDesc, prometheus.CounterValue, float64(s.StepsRedone))
}
