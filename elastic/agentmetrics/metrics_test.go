package agentmetrics

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/rendezvous"
)

// fixedClock is a clock the test moves by hand.
type fixedClock struct{ t time.Time }

func (c *fixedClock) now() time.Time { return c.t }

// newMetrics is the metrics of node a of run 7, on clock.
func newMetrics(t *testing.T, clock *fixedClock) *Metrics {
	t.Helper()
	m, err := New(Config{RunID: "7", Node: "a", Now: clock.now})
	require.NoError(t, err)
	return m
}

// workerOf is local rank local of node rank nodeRank, two workers a node.
func workerOf(nodeRank, local int) distenv.Worker {
	return distenv.Worker{Rank: 2*nodeRank + local, LocalRank: local}
}

// scrape is the text exposition of m, over a real HTTP server.
func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	srv, err := Serve("127.0.0.1:0", m.Handler())
	require.NoError(t, err)
	defer func() { require.NoError(t, srv.Close()) }()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+srv.Addr().String()+"/metrics", nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

// aJob runs m through a job's events: a round, workers that report,
// a worker failure, a smaller round.
func aJob(m *Metrics, clock *fixedClock) {
	m.StateChanged(elastic.StateInit, elastic.StateRendezvous)
	m.RoundStarted(rendezvous.Round{Number: 0, NodeRank: 0, NumNodes: 3, WorldSize: 6}, 1500*time.Millisecond)
	m.StateChanged(elastic.StateRendezvous, elastic.StateRunning)
	for local := range 2 {
		m.WorkerStarted(workerOf(0, local))
		m.WorkerProgress(workerOf(0, local), heartbeat.Progress{Step: 10, Loss: 2.5, TokensPerS: 1000, MFU: 0.25, ComputeS: 0.5})
	}
	m.WorkerExited(workerOf(0, 1), 137)
	m.StateChanged(elastic.StateRunning, elastic.StateStopping)
	m.StateChanged(elastic.StateStopping, elastic.StateRendezvous)
	m.Restarted(elastic.RestartMembershipChange, 1)
	m.RoundStarted(rendezvous.Round{Number: 1, NodeRank: 1, NumNodes: 2, WorldSize: 4}, 3*time.Second)
	m.StateChanged(elastic.StateRendezvous, elastic.StateRunning)
	m.WorkerStarted(workerOf(1, 0))
	m.WorkerStarted(workerOf(1, 1))
	m.WorkerProgress(workerOf(0, 0), heartbeat.Progress{Step: 99, Loss: 9, TokensPerS: 9, MFU: 0.9, ComputeS: 9}) // the old round's: ignored
	m.WorkerProgress(workerOf(1, 0), heartbeat.Unreported(12))
	m.StateChanged(elastic.StateRunning, elastic.StateReforming)
	m.StateChanged(elastic.StateReforming, elastic.StateRendezvous)
	m.RecoveredInPlace(rendezvous.Round{Number: 2, NodeRank: 1, NumNodes: 2, WorldSize: 4}, 0) // a node joined: none lost
	m.StateChanged(elastic.StateRendezvous, elastic.StateRunning)
	clock.t = clock.t.Add(4 * time.Second)
}

func TestExpositionPassesPromtool(t *testing.T) {
	defer goleak.VerifyNone(t)
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		testutil.SkipOrFail(t, "promtool not found: apt-get install prometheus")
	}
	clock := &fixedClock{t: time.Unix(1_700_000_000, 0)}
	m := newMetrics(t, clock)
	aJob(m, clock)
	text := scrape(t, m)

	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Run(), "promtool check metrics:\n%s\n--- exposition ---\n%s", out.String(), text)
	require.Empty(t, strings.TrimSpace(out.String()), "promtool check metrics found problems")
}

func TestSeries(t *testing.T) {
	clock := &fixedClock{t: time.Unix(1_700_000_000, 0)}
	m := newMetrics(t, clock)
	aJob(m, clock)
	text := gorunLines(scrape(t, m))
	for _, want := range []string{
		`gorun_agent_state{node="a",run_id="7",state="running"} 1`,
		`gorun_agent_state{node="a",run_id="7",state="rendezvous"} 0`,
		`gorun_round{node="a",run_id="7"} 1`,
		`gorun_round_nodes{node="a",run_id="7"} 2`,
		`gorun_round_world_size{node="a",run_id="7"} 4`,
		`gorun_node_rank{node="a",run_id="7"} 1`,
		`gorun_restarts_total{cause="membership_change",node="a",run_id="7"} 1`,
		`gorun_restarts_total{cause="worker_failure",node="a",run_id="7"} 0`,
		`gorun_node_losses_total{node="a",run_id="7"} 1`,
		`gorun_in_place_recoveries_total{node="a",run_id="7"} 1`,
		`gorun_agent_state{node="a",run_id="7",state="reforming"} 0`,
		`gorun_rendezvous_duration_seconds_count{node="a",run_id="7"} 2`,
		`gorun_rendezvous_duration_seconds_sum{node="a",run_id="7"} 4.5`,
		`gorun_worker_step{local_rank="0",node="a",rank="2",run_id="7"} 12`,
		`gorun_worker_heartbeat_age_seconds{local_rank="0",node="a",rank="2",run_id="7"} 4`,
	} {
		require.Contains(t, text, want+"\n")
	}
	for _, absent := range []string{
		`,rank="0"`,         // the old round's worker of local rank 0 is gone
		`gorun_worker_loss`, // the new round's workers reported no loss yet
		`gorun_worker_step{local_rank="1"`,
		`gorun_worker_exit_code`, // the exit was the old round's worker's
	} {
		require.NotContains(t, text, absent)
	}
}

// gorunLines are the lines of gorun's own series in an exposition.
func gorunLines(text string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(text, "\n") {
		if strings.HasPrefix(l, "gorun_") {
			b.WriteString(l)
		}
	}
	return b.String()
}

func TestWorkerFigures(t *testing.T) {
	w := workerOf(0, 0)
	for _, tc := range []struct {
		name   string
		events func(m *Metrics)
		want   map[string]float64 // metric name -> value; absent names are not exported
	}{
		{
			name:   "started only",
			events: func(m *Metrics) { m.WorkerStarted(w) },
			want:   map[string]float64{},
		},
		{
			name: "full heartbeat",
			events: func(m *Metrics) {
				m.WorkerStarted(w)
				m.WorkerProgress(w, heartbeat.Progress{Step: 3, Loss: 4.5, TokensPerS: 200, MFU: 0.5, ComputeS: 0.25})
			},
			want: map[string]float64{"gorun_worker_step": 3, "gorun_worker_loss": 4.5, "gorun_worker_tokens_per_second": 200,
				"gorun_worker_mfu_ratio": 0.5, "gorun_worker_step_compute_seconds": 0.25, "gorun_worker_heartbeat_age_seconds": 0},
		},
		{
			name: "step compute is the median of the latest steps",
			events: func(m *Metrics) {
				m.WorkerStarted(w)
				for i, c := range []float64{0.1, 0.9, 0.2} {
					p := heartbeat.Unreported(i + 1)
					p.ComputeS = c
					m.WorkerProgress(w, p)
				}
				m.WorkerProgress(w, heartbeat.Unreported(4)) // no figure: no change
			},
			want: map[string]float64{"gorun_worker_step": 4, "gorun_worker_step_compute_seconds": 0.2, "gorun_worker_heartbeat_age_seconds": 0},
		},
		{
			name: "a step-only heartbeat keeps the figures before it",
			events: func(m *Metrics) {
				m.WorkerStarted(w)
				m.WorkerProgress(w, heartbeat.Progress{Step: 3, Loss: 4.5, TokensPerS: 200, MFU: math.NaN(), ComputeS: math.NaN()})
				m.WorkerProgress(w, heartbeat.Unreported(4))
			},
			want: map[string]float64{"gorun_worker_step": 4, "gorun_worker_loss": 4.5, "gorun_worker_tokens_per_second": 200,
				"gorun_worker_heartbeat_age_seconds": 0},
		},
		{
			name: "exited: its figures stay, its heartbeat age goes",
			events: func(m *Metrics) {
				m.WorkerStarted(w)
				m.WorkerProgress(w, heartbeat.Unreported(4))
				m.WorkerExited(w, 1)
			},
			want: map[string]float64{"gorun_worker_step": 4, "gorun_worker_exit_code": 1},
		},
		{
			name: "restarted: a new process forgets the old one's exit",
			events: func(m *Metrics) {
				m.WorkerStarted(w)
				m.WorkerExited(w, 1)
				m.WorkerStarted(w)
			},
			want: map[string]float64{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMetrics(t, &fixedClock{t: time.Unix(1_700_000_000, 0)})
			tc.events(m)
			families, err := m.Gatherer().Gather()
			require.NoError(t, err)
			got := map[string]float64{}
			for _, f := range families {
				if strings.HasPrefix(f.GetName(), "gorun_worker_") {
					require.Len(t, f.GetMetric(), 1, f.GetName())
					got[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
				}
			}
			require.Equal(t, tc.want, got)
		})
	}
}

func TestRestartCounts(t *testing.T) {
	m := newMetrics(t, &fixedClock{})
	m.Restarted(elastic.RestartWorkerFailure, 0)
	m.Restarted(elastic.RestartWorkerFailure, 0)
	m.Restarted(elastic.RestartMembershipChange, 2)
	require.Equal(t, 2.0, promtest.ToFloat64(m.restarts.WithLabelValues("worker_failure")))
	require.Equal(t, 1.0, promtest.ToFloat64(m.restarts.WithLabelValues("membership_change")))
	require.Equal(t, 2.0, promtest.ToFloat64(m.nodeLosses))
}

func TestWorkerStartCounts(t *testing.T) {
	m := newMetrics(t, &fixedClock{})
	m.WorkersStarted(0, 2) // the first round: nothing warm yet
	m.WorkersStarted(2, 0)
	m.WorkersStarted(1, 1)
	text := gorunLines(scrape(t, m))
	require.Contains(t, text, `gorun_round_worker_starts_total{how="warm",node="a",run_id="7"} 3`+"\n")
	require.Contains(t, text, `gorun_round_worker_starts_total{how="fresh",node="a",run_id="7"} 3`+"\n")
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		err  string
	}{
		{"ok", Config{RunID: "1", Node: "a"}, ""},
		{"no run id", Config{Node: "a"}, "no run id"},
		{"no node", Config{RunID: "1"}, "no node name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			if tc.err == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.err)
		})
	}
}

func TestServeBadAddress(t *testing.T) {
	srv, err := Serve("127.0.0.1:0", http.NotFoundHandler())
	require.NoError(t, err)
	defer func() { require.NoError(t, srv.Close()) }()
	_, err = Serve(srv.Addr().String(), http.NotFoundHandler())
	require.ErrorContains(t, err, "metrics: listen on "+srv.Addr().String())
}
