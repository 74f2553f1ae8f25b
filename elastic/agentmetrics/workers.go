package agentmetrics

import (
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/internal/straggler"
)

// workerLabels label every per-worker series (run_id and node come from
// the registerer).
var workerLabels = []string{"rank", "local_rank"}

var (
	stepDesc = prometheus.NewDesc("gorun_worker_step",
		"Last optimizer step the worker reported done (heartbeat).", workerLabels, nil)
	lossDesc = prometheus.NewDesc("gorun_worker_loss",
		"Training loss of the worker's last reported step.", workerLabels, nil)
	tokensDesc = prometheus.NewDesc("gorun_worker_tokens_per_second",
		"Whole-job training throughput the worker last reported, tokens per second.", workerLabels, nil)
	mfuDesc = prometheus.NewDesc("gorun_worker_mfu_ratio",
		"Model FLOPs utilisation the worker last reported (0..1).", workerLabels, nil)
	ageDesc = prometheus.NewDesc("gorun_worker_heartbeat_age_seconds",
		"Time since the running worker's last heartbeat arrived.", workerLabels, nil)
	computeDesc = prometheus.NewDesc("gorun_worker_step_compute_seconds",
		"Median over the worker's last 10 steps of its step time minus its wait in collectives (embedded trainer only).", workerLabels, nil)
	exitDesc = prometheus.NewDesc("gorun_worker_exit_code",
		"Exit code of the worker's last process (128+N for signal N).", workerLabels, nil)
)

// workerState is what is known of the worker of one local rank; a
// figure is NaN until reported.
type workerState struct {
	rank       int
	step       float64
	loss       float64
	tokensPerS float64
	mfu        float64
	compute    straggler.Window
	lastBeat   time.Time // zero: no heartbeat yet
	exitCode   *int      // nil: running
}

// workerCollector collects the per-worker series at scrape time, so that
// the heartbeat age is current and a worker's series carry the rank it
// has in the latest round.
type workerCollector struct {
	now func() time.Time

	mu      sync.Mutex
	workers map[int]*workerState // by local rank
}

func newWorkerCollector(now func() time.Time) *workerCollector {
	return &workerCollector{now: now, workers: map[int]*workerState{}}
}

func (c *workerCollector) started(w distenv.Worker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.workers[w.LocalRank] = &workerState{rank: w.Rank, step: math.NaN(), loss: math.NaN(), tokensPerS: math.NaN(), mfu: math.NaN()}
}

// current is the state of w if w is still its local rank's worker.
func (c *workerCollector) current(w distenv.Worker) *workerState {
	s := c.workers[w.LocalRank]
	if s == nil || s.rank != w.Rank {
		return nil
	}
	return s
}

// progress records w's heartbeat; it reports false, recording nothing,
// when w is no longer its local rank's worker (an older round's).
func (c *workerCollector) progress(w distenv.Worker, p heartbeat.Progress) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.current(w)
	if s == nil {
		return false
	}
	s.step, s.lastBeat = float64(p.Step), c.now()
	s.compute.Add(p.ComputeS)
	for _, f := range []struct {
		to *float64
		v  float64
	}{{&s.loss, p.Loss}, {&s.tokensPerS, p.TokensPerS}, {&s.mfu, p.MFU}} {
		if !math.IsNaN(f.v) {
			*f.to = f.v
		}
	}
	return true
}

func (c *workerCollector) exited(w distenv.Worker, code int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.current(w); s != nil {
		s.exitCode = &code
	}
}

// Describe sends the descriptions of every per-worker series.
func (c *workerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{stepDesc, lossDesc, tokensDesc, mfuDesc, computeDesc, ageDesc, exitDesc} {
		ch <- d
	}
}

// Collect sends every known figure of every worker.
func (c *workerCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	for local, s := range c.workers {
		labels := []string{strconv.Itoa(s.rank), strconv.Itoa(local)}
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
		}
		for _, f := range []struct {
			d *prometheus.Desc
			v float64
		}{{stepDesc, s.step}, {lossDesc, s.loss}, {tokensDesc, s.tokensPerS}, {mfuDesc, s.mfu}, {computeDesc, s.compute.Median()}} {
			if !math.IsNaN(f.v) {
				gauge(f.d, f.v)
			}
		}
		if !s.lastBeat.IsZero() && s.exitCode == nil { // an ended worker is not late
			gauge(ageDesc, now.Sub(s.lastBeat).Seconds())
		}
		if s.exitCode != nil {
			gauge(exitDesc, float64(*s.exitCode))
		}
	}
}
