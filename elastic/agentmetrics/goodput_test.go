package agentmetrics

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/rendezvous"
)

// TestGoodput follows a node through a worker-failure restart and an in-place recovery, on a
// clock moved by hand, and reads gorun_goodput_ratio and gorun_time_lost_seconds_total from the
// text exposition served over HTTP:
//
//	t 0-4     steps 1-5, one a second (4 s on steps)
//	t 5       the agent leaves its round (detection: 1 s after step 5): a worker failed
//	t 7       round 1 formed, a restart (rendezvous: 2 s)
//	t 10      step 3 again, 2 steps redone, 1 s of state restore reported (state transfer: 1 s;
//	          first step: 2 s; redone: 2 x the 1 s median)
//	t 11-12   steps 4-5 (2 s on steps)
//	t 12.5    the agent leaves its round for an in-place recovery: node b left (detection 0.5 s)
//	t 13      round 2 formed in place (rendezvous 0.5 s)
//	t 13.25   step 6 (first step 0.25 s), nothing redone
//	t 14.25   step 7 (1 s on steps)
//	t 20      scraped: (4 + 2 + 1 - 2) s kept over 20 s = 0.25
func TestGoodput(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	clock := &fixedClock{t: t0}
	at := func(s float64) { clock.t = t0.Add(time.Duration(s * float64(time.Second))) }
	m := newMetrics(t, clock)
	ratio := func() string {
		for _, l := range strings.Split(gorunLines(scrape(t, m)), "\n") {
			if strings.HasPrefix(l, "gorun_goodput_ratio") {
				return l
			}
		}
		t.Fatal("no gorun_goodput_ratio line")
		return ""
	}
	require.Equal(t, `gorun_goodput_ratio{node="a",run_id="7"} NaN`, ratio(), "no step yet")

	start := func(round int) {
		m.RoundStarted(rendezvous.Round{Number: round, NumNodes: 2, WorldSize: 4}, time.Second)
		m.StateChanged(elastic.StateRendezvous, elastic.StateRunning)
	}
	step := func(s float64, n int, redone float64) {
		at(s)
		for local := range 2 {
			p := heartbeat.Unreported(n)
			p.Redone = redone
			if redone > 0 {
				p.StateS = 1
			}
			m.WorkerProgress(workerOf(0, local), p)
		}
	}
	m.StateChanged(elastic.StateInit, elastic.StateRendezvous)
	start(0)
	m.WorkerStarted(workerOf(0, 0))
	m.WorkerStarted(workerOf(0, 1))
	for s := range 5 {
		step(float64(s), s+1, math.NaN())
	}
	at(5)
	m.StateChanged(elastic.StateRunning, elastic.StateStopping)
	m.RoundEnded(rendezvous.End{Cause: rendezvous.CauseFailure, Reason: "worker failure"})
	m.StateChanged(elastic.StateStopping, elastic.StateRendezvous)
	at(7)
	m.Restarted(elastic.RestartWorkerFailure, 0)
	start(1)
	m.WorkerStarted(workerOf(0, 0))
	m.WorkerStarted(workerOf(0, 1))
	step(10, 3, 2)
	step(11, 4, math.NaN())
	step(12, 5, math.NaN())
	at(12.5)
	m.StateChanged(elastic.StateRunning, elastic.StateReforming)
	m.RoundEnded(rendezvous.End{Cause: rendezvous.CauseMembership, Lost: []string{"b"}, Reason: "node b left (its lease expired, or a peer found its agent dead)"})
	at(13)
	m.RecoveredInPlace(rendezvous.Round{Number: 2, NumNodes: 2, WorldSize: 4}, 0)
	m.RoundStarted(rendezvous.Round{Number: 2, NumNodes: 2, WorldSize: 4}, 500*time.Millisecond)
	m.StateChanged(elastic.StateReforming, elastic.StateRunning)
	step(13.25, 6, math.NaN())
	step(14.25, 7, math.NaN())
	at(20)

	text := gorunLines(scrape(t, m))
	for _, want := range []string{
		`gorun_goodput_ratio{node="a",run_id="7"} 0.25`,
		`gorun_time_lost_seconds_total{cause="worker",node="a",phase="detection",run_id="7"} 1`,
		`gorun_time_lost_seconds_total{cause="worker",node="a",phase="rendezvous",run_id="7"} 2`,
		`gorun_time_lost_seconds_total{cause="worker",node="a",phase="state_transfer",run_id="7"} 1`,
		`gorun_time_lost_seconds_total{cause="worker",node="a",phase="first_step",run_id="7"} 2`,
		`gorun_time_lost_seconds_total{cause="worker",node="a",phase="redone_steps",run_id="7"} 2`,
		`gorun_time_lost_seconds_total{cause="node",node="a",phase="detection",run_id="7"} 0.5`,
		`gorun_time_lost_seconds_total{cause="node",node="a",phase="rendezvous",run_id="7"} 0.5`,
		`gorun_time_lost_seconds_total{cause="node",node="a",phase="state_transfer",run_id="7"} 0`,
		`gorun_time_lost_seconds_total{cause="node",node="a",phase="first_step",run_id="7"} 0.25`,
		`gorun_time_lost_seconds_total{cause="node",node="a",phase="redone_steps",run_id="7"} 0`,
		`gorun_time_lost_seconds_total{cause="network",node="a",phase="rendezvous",run_id="7"} 0`,
		`gorun_steps_redone_total{node="a",run_id="7"} 2`,
	} {
		require.Contains(t, text, want+"\n")
	}

	// The job's end (a requeue) is no recovery: nothing more is lost, the ratio falls with time.
	m.StateChanged(elastic.StateRunning, elastic.StateFailed)
	at(40)
	require.Equal(t, `gorun_goodput_ratio{node="a",run_id="7"} 0.125`, ratio())
	require.Contains(t, gorunLines(scrape(t, m)), `gorun_time_lost_seconds_total{cause="worker",node="a",phase="detection",run_id="7"} 1`+"\n")
}

// TestCauseOf charges each kind of round end to its cause, from the
// reasons package rendezvous writes.
func TestCauseOf(t *testing.T) {
	for _, tc := range []struct {
		end  rendezvous.End
		want string
	}{
		{rendezvous.End{Cause: rendezvous.CauseFailure, Reason: "worker failure: rank 3 on b", InPlace: true}, "worker"},
		{rendezvous.End{Cause: rendezvous.CauseMembership, Lost: []string{"c"}, Reason: "node c left (its lease expired, or a peer found its agent dead)"}, "node"},
		{rendezvous.End{Cause: rendezvous.CauseMembership, Reason: "node c left out: its agent did not answer a member's probe (the node died, or a network fault cut it off one way or both); it rejoins once it reaches every member"}, "network"},
		{rendezvous.End{Cause: rendezvous.CauseMembership, Reason: "node c evicted: its rank 5 was the job's straggler for 2m0s"}, "straggler"},
		{rendezvous.End{Cause: rendezvous.CauseMembership, Grow: true, Reason: "node d waiting to join"}, "restart"},
		{rendezvous.End{Cause: rendezvous.CauseMembership}, "restart"},
	} {
		require.Equal(t, tc.want, causeOf(tc.end).String(), tc.end.Reason)
	}
}
