package agentmetrics

import (
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/goodput"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/rendezvous"
)

// Config says which agent the metrics describe: every series carries
// its run_id and node labels.
type Config struct {
	RunID string
	Node  string // the host name the agent announces
	// SnapshotDir is the job's snapshot directory on this node (it may
	// not exist yet); "": snapshots are off.
	SnapshotDir string
	// Now is the clock of gorun_worker_heartbeat_age_seconds; nil is
	// time.Now.
	Now func() time.Time
}

// Validate reports what makes cfg unusable.
func (c Config) Validate() error {
	switch {
	case c.RunID == "":
		return errors.New("agentmetrics: no run id")
	case c.Node == "":
		return errors.New("agentmetrics: no node name")
	}
	return nil
}

// Metrics is one agent's metrics: an elastic.Observer whose events
// update them, and the registry they are gathered from. It is safe for
// concurrent use.
type Metrics struct {
	reg        *prometheus.Registry
	state      *prometheus.GaugeVec
	round      prometheus.Gauge
	nodes      prometheus.Gauge
	worldSize  prometheus.Gauge
	nodeRank   prometheus.Gauge
	restarts   *prometheus.CounterVec
	nodeLosses prometheus.Counter
	inPlace    prometheus.Counter
	starts     *prometheus.CounterVec
	rendezvous prometheus.Histogram
	workers    *workerCollector
	goodput    *goodputRecorder
	snapshots  *snapshotCollector
}

var (
	_ elastic.Observer      = (*Metrics)(nil)
	_ elastic.EndObserver   = (*Metrics)(nil)
	_ elastic.StartObserver = (*Metrics)(nil)

	_ elastic.SnapshotObserver = (*Metrics)(nil)
)

var nan = math.NaN()

// New makes the metrics of the agent cfg describes, on a registry of
// their own that also holds the Go runtime's and the process's metrics.
func New(cfg Config) (*Metrics, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gorun_agent_state",
			Help: "The agent's state: 1 for the current one, 0 for the others."}, []string{"state"}),
		round: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gorun_round",
			Help: "Number of the round this node runs or ran last (TORCHELASTIC_RESTART_COUNT)."}),
		nodes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gorun_round_nodes",
			Help: "Nodes in the current round."}),
		worldSize: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gorun_round_world_size",
			Help: "Workers in the current round, all nodes."}),
		nodeRank: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gorun_node_rank",
			Help: "This node's rank in the current round."}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorun_restarts_total",
			Help: "Rounds that replaced one this node ran, by cause: worker_failure (as many nodes as before) or membership_change."},
			[]string{"cause"}),
		nodeLosses: prometheus.NewCounter(prometheus.CounterOpts{Name: "gorun_node_losses_total",
			Help: "Nodes the job lost, as the rounds this node ran shrank."}),
		inPlace: prometheus.NewCounter(prometheus.CounterOpts{Name: "gorun_in_place_recoveries_total",
			Help: "Rounds that took over this node's workers in place after a membership change, instead of restarting them (not counted in gorun_restarts_total)."}),
		starts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorun_round_worker_starts_total",
			Help: "Workers the rounds started on this node (not those kept in place), by how: warm (a warm worker, --warm-workers, made the round's) or fresh (a new process)."},
			[]string{"how"}),
		rendezvous: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gorun_rendezvous_duration_seconds",
			Help:    "How long this node waited in the rendezvous for each of its rounds to form.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 9)}),
		workers:   newWorkerCollector(cfg.Now),
		goodput:   newGoodputRecorder(cfg.Now),
		snapshots: newSnapshotCollector(cfg.SnapshotDir),
	}
	for _, s := range elastic.States() {
		m.state.WithLabelValues(s.String())
	}
	m.state.WithLabelValues(elastic.StateInit.String()).Set(1)
	for _, c := range []elastic.RestartCause{elastic.RestartWorkerFailure, elastic.RestartMembershipChange} {
		m.restarts.WithLabelValues(c.String())
	}
	m.starts.WithLabelValues("warm")
	m.starts.WithLabelValues("fresh")
	labelled := prometheus.WrapRegistererWith(prometheus.Labels{"run_id": cfg.RunID, "node": cfg.Node}, m.reg)
	for _, c := range []prometheus.Collector{m.state, m.round, m.nodes, m.worldSize, m.nodeRank, m.restarts, m.nodeLosses, m.inPlace, m.starts, m.rendezvous, m.workers, m.goodput, m.snapshots} {
		if err := labelled.Register(c); err != nil {
			return nil, err
		}
	}
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := m.reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Gatherer is the registry the metrics are gathered from.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.reg }

// Handler serves the metrics in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// StateChanged sets the state-set gauge gorun_agent_state; leaving a
// round that trained, for anything but the job's end, starts a recovery.
func (m *Metrics) StateChanged(from, to elastic.State) {
	m.state.WithLabelValues(from.String()).Set(0)
	m.state.WithLabelValues(to.String()).Set(1)
	if from == elastic.StateRunning && to != elastic.StateSucceeded && to != elastic.StateFailed {
		m.goodput.leftRound()
	}
}

// RoundStarted sets the round gauges and observes the rendezvous time.
func (m *Metrics) RoundStarted(r rendezvous.Round, formed time.Duration) {
	m.round.Set(float64(r.Number))
	m.nodes.Set(float64(r.NumNodes))
	m.worldSize.Set(float64(r.WorldSize))
	m.nodeRank.Set(float64(r.NodeRank))
	m.rendezvous.Observe(formed.Seconds())
	m.snapshots.roundStarted()
}

// Restarted counts a restart by cause, and the nodes it lost.
func (m *Metrics) Restarted(cause elastic.RestartCause, nodesLost int) {
	m.restarts.WithLabelValues(cause.String()).Inc()
	m.goodput.roundFormed()
	m.nodeLosses.Add(float64(nodesLost))
}

// RecoveredInPlace counts an in-place recovery, and the nodes it lost.
func (m *Metrics) RecoveredInPlace(_ rendezvous.Round, nodesLost int) {
	m.inPlace.Inc()
	m.goodput.roundFormed()
	m.nodeLosses.Add(float64(nodesLost))
}

// WorkerStarted makes w the worker of its local rank, with no figures yet.
func (m *Metrics) WorkerStarted(w distenv.Worker) {
	m.workers.started(w)
	m.snapshots.workerStarted(w)
}

// WorkerProgress records w's heartbeat for the per-worker series,
// and a step of the lowest local rank for the goodput figures.
func (m *Metrics) WorkerProgress(w distenv.Worker, p heartbeat.Progress) {
	if m.workers.progress(w, p) {
		m.goodput.step(w.LocalRank, p.Redone, p.StateS)
	}
}

// RoundEnded charges the recovery under way to why the round ended.
func (m *Metrics) RoundEnded(end rendezvous.End) { m.goodput.roundEnded(end) }

// Goodput is this node's goodput figures now (package goodput).
func (m *Metrics) Goodput() goodput.Summary { return m.goodput.summary() }

// WorkersStarted counts a round's workers by how they started.
func (m *Metrics) WorkersStarted(warm, fresh int) {
	m.starts.WithLabelValues("warm").Add(float64(warm))
	m.starts.WithLabelValues("fresh").Add(float64(fresh))
}

// WorkerExited records w's exit code.
func (m *Metrics) WorkerExited(w distenv.Worker, exitCode int) { m.workers.exited(w, exitCode) }
