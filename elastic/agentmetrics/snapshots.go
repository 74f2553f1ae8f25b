package agentmetrics

import (
	"math"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/snapshot"
	"github.com/gorun/gorun/rendezvous"
)

var (
	snapStepDesc = prometheus.NewDesc("gorun_snapshot_step",
		"Newest complete snapshot step of each rank of this node (its slot headers, read at scrape time).", []string{"rank"}, nil)
	snapReplicaDesc = prometheus.NewDesc("gorun_snapshot_replica_step",
		"Newest step of each rank of this node whose snapshot a peer node holds a copy of, by the peer's replica address.", []string{"rank", "peer"}, nil)
	snapRestoredDesc = prometheus.NewDesc("gorun_snapshot_restored_step",
		"The step the agents agreed the workers restore, at the last recovery that restored one.", nil, nil)
	snapRedoneDesc = prometheus.NewDesc("gorun_snapshot_steps_redone_total",
		"Steps the snapshot recoveries threw away: at each, the newest step any rank had less the step restored.", nil, nil)
	snapRecoveriesDesc = prometheus.NewDesc("gorun_snapshot_recoveries_total",
		"Rounds whose workers started with snapshots somewhere in the job, by result: restored (every rank restored one step), none (the reason is in the agent's log).", []string{"result"}, nil)
)

// snapshotCollector follows this node's snapshots: the newest step of its
// current ranks (read from the slot headers at scrape time), the copies on
// other nodes, and the recoveries. A zero dir: no snapshots, no series.
type snapshotCollector struct {
	dir string

	mu        sync.Mutex
	ranks     map[int]bool              // this node's ranks in its current round
	replicas  map[int]map[string]uint64 // rank -> peer -> newest step copied there
	restored  float64                   // NaN: none yet
	redone    uint64
	recovered map[string]uint64 // result -> count
}

func newSnapshotCollector(dir string) *snapshotCollector {
	return &snapshotCollector{dir: dir, ranks: map[int]bool{}, replicas: map[int]map[string]uint64{}, restored: math.NaN(),
		recovered: map[string]uint64{"restored": 0, "none": 0}}
}

func (c *snapshotCollector) roundStarted() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.ranks)
}

func (c *snapshotCollector) workerStarted(w distenv.Worker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ranks[w.Rank] = true
}

func (c *snapshotCollector) agreed(rec elastic.SnapshotRecovery) {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.replicas) // the new round's peers may differ
	if !rec.Held {
		return // the job's first snapshots are still to come: no recovery
	}
	if rec.Restored {
		c.restored = float64(rec.Step)
		c.redone += rec.Redone()
		c.recovered["restored"]++
		return
	}
	c.recovered["none"]++
}

func (c *snapshotCollector) replicated(rank int, step uint64, peer string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.replicas[rank] == nil {
		c.replicas[rank] = map[string]uint64{}
	}
	c.replicas[rank][peer] = max(c.replicas[rank][peer], step)
}

// Describe sends the descriptions of the snapshot series.
func (c *snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{snapStepDesc, snapReplicaDesc, snapRestoredDesc, snapRedoneDesc, snapRecoveriesDesc} {
		ch <- d
	}
}

// Collect sends the snapshot series; none without a directory.
func (c *snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	if c.dir == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for rank := range c.ranks {
		if step, ok := snapshot.NewestHeader(c.dir, rank); ok {
			ch <- prometheus.MustNewConstMetric(snapStepDesc, prometheus.GaugeValue, float64(step), strconv.Itoa(rank))
		}
	}
	for rank, peers := range c.replicas {
		for peer, step := range peers {
			ch <- prometheus.MustNewConstMetric(snapReplicaDesc, prometheus.GaugeValue, float64(step), strconv.Itoa(rank), peer)
		}
	}
	if !math.IsNaN(c.restored) {
		ch <- prometheus.MustNewConstMetric(snapRestoredDesc, prometheus.GaugeValue, c.restored)
	}
	ch <- prometheus.MustNewConstMetric(snapRedoneDesc, prometheus.CounterValue, float64(c.redone))
	for result, n := range c.recovered {
		ch <- prometheus.MustNewConstMetric(snapRecoveriesDesc, prometheus.CounterValue, float64(n), result)
	}
}

// SnapshotsAgreed records a round's agreement (elastic.SnapshotObserver).
func (m *Metrics) SnapshotsAgreed(_ rendezvous.Round, rec elastic.SnapshotRecovery) {
	m.snapshots.agreed(rec)
}

// SnapshotReplicated records a copy of rank's snapshot of step on peer
// (elastic.SnapshotObserver).
func (m *Metrics) SnapshotReplicated(rank int, step uint64, peer string) {
	m.snapshots.replicated(rank, step, peer)
}
