package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/internal/goodput"
	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/trainer/metrics"
)

// goodputWait bounds how long the recovery takes to show in the agents' metrics and in
// gorun status.
const goodputWait = 90 * time.Second

// TestGoodput: two real agents of the embedded trainer over a real etcd, each serving its
// Prometheus metrics; worker rank 3 is killed -9 between two steps (every worker paused). Once
// the recovery's first step has ended on both nodes, the goodput figures in each agent's
// /metrics and in `gorun status --json` are there and agree: a ratio in (0,1), the lost time
// all charged to "worker", its phases (state transfer included) summing to it, wall time split
// into effective, lost and pending time, and the steps redone those rank 0's metrics file
// recorded twice. `gorun status` (text) shows them, and --json still does once the job stopped.
func TestGoodput(t *testing.T) {
	toml := trainerToml(t)
	endpoint := etcdtest.Start(t).Endpoints()[0]
	ports, err := testutil.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	j := newFaultJob(t, toml, endpoint, "goodput", t.TempDir(), "2")
	j.sets = []string{"--set", "train.steps=1000000"} // runs until the test's cleanup stops it
	metrics := map[string]string{}
	for i, name := range []string{"node-a", "node-b"} {
		metrics[name] = fmt.Sprintf("127.0.0.1:%d", ports[i])
		j.start(name, "--metrics-addr="+metrics[name])
	}
	j.waitStep(12)
	paused := j.pause()
	pid := 0
	for _, w := range j.workers() {
		if w.rank == 3 { // round 0: the first RANK is the rank
			pid = w.pid
		}
	}
	if pid == 0 {
		t.Fatal("no worker of rank 3")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	resume(paused)

	// The event: each node's recovery ended (its first step after it), as its metrics say.
	prom := map[string]map[string]float64{}
	deadline := time.Now().Add(goodputWait)
	for name, addr := range metrics {
		for {
			prom[name] = goodputSeries(httpGet(t, "http://"+addr+"/metrics"))
			if recoveryEnded(prom[name]) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no recovery in its metrics after %v:\n%v", name, goodputWait, prom[name])
			}
			time.Sleep(50 * time.Millisecond) // polling the agent for the event
		}
	}
	// gorun status: once both nodes published the recovery (every 2 s).
	var st struct {
		Goodput goodput.Job `json:"goodput"`
	}
	for {
		out := runGorun(t, nil, "status", "--json", "--rdzv-endpoint="+endpoint, "--rdzv-id="+j.runID).Stdout
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("gorun status --json: %v\n%s", err, out)
		}
		if len(st.Goodput.Nodes) == 2 && st.Goodput.Nodes[0].Recoveries == 1 && st.Goodput.Nodes[1].Recoveries == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gorun status shows no recovery on both nodes after %v:\n%s", goodputWait, out)
		}
		time.Sleep(250 * time.Millisecond) // polling etcd for the agents' next publication
	}
	raw, kept := j.recordCounts()
	redone := raw - kept

	for name, s := range prom {
		requireInside(t, name+": gorun_goodput_ratio", s["gorun_goodput_ratio"])
		for _, c := range goodput.Causes {
			for _, p := range goodput.Phases {
				v := s[fmt.Sprintf(`gorun_time_lost_seconds_total{cause="%s",phase="%s"}`, c, p)]
				switch {
				case c == goodput.Worker && (p == goodput.StateTransfer || p == goodput.FirstStep) && v <= 0:
					t.Errorf("%s: the recovery lost no %s time to the worker's failure: %v", name, p, s)
				case c != goodput.Worker && v != 0:
					t.Errorf("%s: %v s lost to %s in %s, want all of it charged to the worker: %v", name, v, c, p, s)
				}
			}
		}
		if got := s["gorun_steps_redone_total"]; got != float64(redone) {
			t.Errorf("%s: gorun_steps_redone_total %v, rank 0's metrics file redid %d steps (%d records, %d steps)", name, got, redone, raw, kept)
		}
	}

	g := st.Goodput
	if !g.Measured || g.Recoveries != 1 || g.StepsRedone != redone {
		t.Errorf("gorun status: measured %v, %d recoveries, %d steps redone; want true, 1, %d", g.Measured, g.Recoveries, g.StepsRedone, redone)
	}
	requireInside(t, "gorun status: ratio", g.Ratio)
	for _, s := range append([]goodput.Summary{g.Summary}, g.Nodes[0].Summary, g.Nodes[1].Summary) {
		byPhase := 0.0
		for _, p := range goodput.Phases {
			byPhase += s.LostByPhase[p.String()]
		}
		requireNear(t, "lost time by phase, summed", s.LostSeconds, byPhase)
		requireNear(t, "lost time charged to the worker", s.LostSeconds, s.LostByCause["worker"])
		requireNear(t, "wall = effective + lost + pending", s.WallSeconds, s.EffectiveSeconds+s.LostSeconds+s.PendingSeconds)
		if s.LostSeconds <= 0 || s.LostByPhase["state_transfer"] <= 0 {
			t.Errorf("gorun status: lost %v s, %v s of it in state transfer; want both > 0", s.LostSeconds, s.LostByPhase["state_transfer"])
		}
	}
	// The agents' metrics and status agree: lost time only grows at a recovery's end, and
	// there was one.
	for _, n := range g.Nodes {
		for _, c := range goodput.Causes {
			for _, p := range goodput.Phases {
				series := fmt.Sprintf(`gorun_time_lost_seconds_total{cause="%s",phase="%s"}`, c, p)
				if got, want := n.Lost[c.String()][p.String()], prom[n.Host][series]; math.Abs(got-want) > 1e-9 {
					t.Errorf("%s: gorun status says %v s for %s, its metrics %v", n.Host, got, series, want)
				}
			}
		}
	}
	text := runGorun(t, nil, "status", "--rdzv-endpoint="+endpoint, "--rdzv-id="+j.runID).Stdout
	if !strings.Contains(text, "goodput: 0.") || !strings.Contains(text, "1 recoveries") ||
		!strings.Contains(text, "node-seconds: worker ") || !strings.Contains(text, "state transfer ") {
		t.Errorf("gorun status shows no goodput, or not the worker's recovery:\n%s", text)
	}
	t.Logf("gorun status:\n%s", text)

	// The job stops (SIGTERM to every agent): each agent writes its figures once more as it
	// ends, unleased, so status still shows them after the job.
	stopAt := time.Now()
	for _, a := range j.agents {
		a.cancel()
	}
	for _, a := range j.agents {
		a.wait()
	}
	var after struct {
		Goodput goodput.Job `json:"goodput"`
	}
	out := runGorun(t, nil, "status", "--json", "--rdzv-endpoint="+endpoint, "--rdzv-id="+j.runID).Stdout
	if err := json.Unmarshal([]byte(out), &after); err != nil {
		t.Fatalf("gorun status --json: %v\n%s", err, out)
	}
	if len(after.Goodput.Nodes) != 2 || after.Goodput.Recoveries != 1 {
		t.Fatalf("gorun status after the job: want both nodes' figures, 1 recovery:\n%s", out)
	}
	// Stopping is no recovery: what was lost is still all the worker's.
	requireNear(t, "lost time charged to the worker, after the job", after.Goodput.LostSeconds, after.Goodput.LostByCause["worker"])
	for _, n := range after.Goodput.Nodes {
		if n.At.Before(stopAt) {
			t.Errorf("%s: its last figures are of %v, before the job stopped at %v", n.Host, n.At, stopAt)
		}
	}
}

// recoveryEnded says whether an agent's goodput series (goodputSeries) count a recovery's
// first step, whatever its cause.
func recoveryEnded(series map[string]float64) bool {
	for _, c := range goodput.Causes {
		if series[fmt.Sprintf(`gorun_time_lost_seconds_total{cause="%s",phase="first_step"}`, c)] > 0 {
			return true
		}
	}
	return false
}

// goodputSeries are the goodput series of an agent's /metrics text, by name and their cause
// and phase labels (the others left out): `gorun_time_lost_seconds_total{cause="worker",
// phase="detection"}`, `gorun_goodput_ratio`, `gorun_steps_redone_total`.
func goodputSeries(text string) map[string]float64 {
	out := map[string]float64{}
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, "gorun_goodput_ratio") && !strings.HasPrefix(l, "gorun_time_lost_seconds_total") &&
			!strings.HasPrefix(l, "gorun_steps_redone_total") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err != nil {
			continue
		}
		name, labels, _ := strings.Cut(l[:i], "{")
		var keep []string
		for _, kv := range strings.Split(strings.TrimSuffix(labels, "}"), ",") {
			if strings.HasPrefix(kv, "cause=") || strings.HasPrefix(kv, "phase=") {
				keep = append(keep, kv)
			}
		}
		if len(keep) > 0 {
			name += "{" + strings.Join(keep, ",") + "}"
		}
		out[name] = v
	}
	return out
}

// recordCounts reads rank 0's metrics file once: its records of steps (raw, a step redone
// after a recovery counted again) and the steps of the job's final line of steps (kept).
func (j *faultJob) recordCounts() (raw, kept int) {
	recs, _ := metrics.ReadFile(j.metrics)
	return len(recs), len(metrics.History(recs))
}

// requireInside fails t unless 0 < v < 1.
func requireInside(t *testing.T, what string, v float64) {
	t.Helper()
	if !(v > 0 && v < 1) {
		t.Errorf("%s = %v, want in (0, 1)", what, v)
	}
}

// requireNear fails t unless got is want up to float rounding.
func requireNear(t *testing.T, what string, want, got float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-6*max(1, math.Abs(want)) {
		t.Errorf("%s: %v, want %v", what, got, want)
	}
}
