package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/test/harness"
	"github.com/gorun/gorun/trainer/metrics"
)

// Issue 19 item 7: real network faults. Three agents of 2 workers of the embedded trainer and a
// `gorun rendezvous serve` etcd, each host in its own network namespace behind a bridge (netLab),
// lease_ttl 2 s; faults are silent drops by nftables on the bridge, and a delay by a userspace
// relay in a host's link (netRelay: the kernel has no netem), healed by deleting the rules and
// setting the delay back to 0.
const (
	// netLeaseTTL is the agents' lease_ttl.
	netLeaseTTL = 2 * time.Second
	// netBound is the bound on a stall, and on the time from the heal until every node is
	// back in the job: lease TTL + 2 s.
	netBound = netLeaseTTL + 2*time.Second
	// netEvery is the checkpoint period in steps: the final models are compared at a multiple of
	// it that the world of all three nodes wrote after the heal.
	netEvery = 250
	// netFaultStep is the step the fault waits for (past the warm-up, in the first round).
	netFaultStep = 300
)

// netFaultSets: the tiny model of trainerSets (about 7 ms a step at world size 6 on a busy
// 2-core machine), a global batch that 4 and 6 ranks divide, a constant learning rate after
// the warm-up (min_lr = lr) so that a step's model does not depend on train.steps: the job runs
// "forever" and the test stops it (SIGUSR1: checkpoint and exit 75) once it has seen what it
// needs, and a reference run to step k gives the same bits at k.
var netFaultSets = append(append([]string(nil), trainerSets...),
	"--set", "train.global_batch=24", "--set", "train.steps=1000000", "--set", "train.log_every=100000",
	"--set", "optim.lr=3e-3", "--set", "optim.min_lr=3e-3",
	"--set", fmt.Sprintf("checkpoint.every=%d", netEvery), "--set", "checkpoint.keep=3")

// netScenario is one network fault.
type netScenario struct {
	name string
	// rules are the nft matches to drop for the fault's duration.
	rules func(l *netLab) []string
	// delays hold each frame a host sends or receives that long for the fault's duration
	// (netLab.Delay; the host's link is then a relay).
	delays map[string]time.Duration
	dur    time.Duration
	// full: only with GORUN_NETFAULT=all (the CI run stays under about 2 minutes).
	full bool
}

// netRow is what one scenario measured.
type netRow struct {
	name string
	// stall is the longest time between two consecutive metrics records from the fault until
	// the job was stopped.
	stall time.Duration
	// redone is how many steps were trained more than once (records that History leaves out).
	redone int
	// left says a node left the job (a record at a world size below 6 after the fault);
	// rejoin is then the time from the heal to the first record of the whole world after the
	// last record of a smaller one (negative: never back).
	left   bool
	rejoin time.Duration
	// compareStep is the checkpoint compared with the reference (0: none).
	compareStep int
	dir         string
	// notes are what else went wrong (an agent's exit, a step missing).
	notes []string
}

func (r netRow) String() string {
	rejoin := "never left"
	switch {
	case r.left && r.rejoin < 0:
		rejoin = "never back"
	case r.left:
		rejoin = fmt.Sprintf("%.1f s", r.rejoin.Seconds())
	}
	return fmt.Sprintf("| %s | %.1f s | %d | %s | %s |", r.name, r.stall.Seconds(), r.redone, rejoin, strings.Join(r.notes, "; "))
}

// TestNetFaults runs each scenario of issue 19's table on real agents, a real etcd and real
// network faults, and asserts what item 7 asks: 0 steps redone, no stall longer than lease TTL
// + 2 s (from the metrics records' times), every node back in the job within lease TTL + 2 s of
// the heal, each step once, and a model allclose to a fault-free run. The measured table is
// logged (bench/netfault.sh prints it). GORUN_NETFAULT=all adds the longer scenarios.
func TestNetFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("network faults take minutes (-short)")
	}
	requireNetLab(t)
	all := os.Getenv("GORUN_NETFAULT") == "all"

	scenarios := []netScenario{
		{name: "node C cut off 10 s", dur: 10 * time.Second,
			rules: func(l *netLab) []string { return l.Cut("c") }},
		// Full only since CI passed 20 minutes: C leaves the job as in the cut above (its
		// lease expires), with its data plane up; the next scenario loses etcd for everyone.
		{name: "C cut from etcd only 15 s", dur: 15 * time.Second, full: true,
			rules: func(l *netLab) []string { return l.CutBetween("c", "etcd") }},
		{name: "etcd cut off 15 s", dur: 15 * time.Second,
			rules: func(l *netLab) []string { return l.Cut("etcd") }},
		{name: "one way C -> A dropped 10 s", dur: 10 * time.Second,
			rules: func(l *netLab) []string { return []string{l.OneWay("c", "a")} }},
		{name: "one way C -> A dropped 30 s", dur: 30 * time.Second, full: true,
			rules: func(l *netLab) []string { return []string{l.OneWay("c", "a")} }},
		{name: "B 30 % loss both ways 20 s", dur: 20 * time.Second, full: true,
			rules: func(l *netLab) []string { return l.Loss("b", 30) }},
		{name: "B 30 % loss + 100 ms delay both ways 20 s", dur: 20 * time.Second, full: true,
			rules:  func(l *netLab) []string { return l.Loss("b", 30) },
			delays: map[string]time.Duration{"b": 100 * time.Millisecond}},
		// Node A hosts rank 0, which commits the shared checkpoint directory's
		// steps: the world without it must commit, and A must not commit
		// anything stale when it comes back.
		{name: "node A (rank 0) cut off 10 s", dur: 10 * time.Second, full: true,
			rules: func(l *netLab) []string { return l.Cut("a") }},
		{name: "node C cut off 150 s", dur: 150 * time.Second, full: true,
			rules: func(l *netLab) []string { return l.Cut("c") }},
	}
	// A host's link is a relay (userspace, for the delay) only when a scenario that runs delays
	// it: the others keep the kernel's veth.
	var relayed []string
	for _, sc := range scenarios {
		for h := range sc.delays {
			if (all || !sc.full) && !slices.Contains(relayed, h) {
				relayed = append(relayed, h)
			}
		}
	}
	if len(relayed) > 0 {
		requireTun(t)
	}
	lab := newNetLab(t, []string{"etcd", "a", "b", "c"}, withRelay(relayed...))
	toml := trainerToml(t)
	root := t.TempDir()
	var rows []netRow
	t.Cleanup(func() {
		var b strings.Builder
		b.WriteString("network faults (lease_ttl 2 s; bound " + netBound.String() + "):\n| fault | longest stall | steps redone | back in the job after the heal | notes |\n|---|---|---|---|---|\n")
		for _, r := range rows {
			b.WriteString(r.String() + "\n")
		}
		t.Log(b.String())
	})
	for i, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			if sc.full && !all {
				t.Skip("one of the longer scenarios: GORUN_NETFAULT=all runs it")
			}
			row := runNetScenario(t, lab, toml, filepath.Join(root, fmt.Sprint("s", i)), sc)
			rows = append(rows, row)
			var bad []string
			if row.redone != 0 {
				bad = append(bad, fmt.Sprintf("%d steps redone, want 0", row.redone))
			}
			if row.stall > netBound {
				bad = append(bad, fmt.Sprintf("a stall of %.1f s, want at most %v", row.stall.Seconds(), netBound))
			}
			if row.left && (row.rejoin < 0 || row.rejoin > netBound) {
				bad = append(bad, fmt.Sprintf("every node back in the job %v after the heal, want within %v", row.rejoin.Round(time.Millisecond), netBound))
			}
			bad = append(bad, row.notes...)
			for _, b := range bad {
				t.Error(b)
			}
		})
	}

	// One fault-free reference to the newest step compared, on one node: every layout gives
	// the same bits, so the jobs' checkpoints at step k must be allclose to its step k.
	last := 0
	for _, r := range rows {
		last = max(last, r.compareStep)
	}
	if last == 0 {
		return
	}
	t.Run("final models allclose to a fault-free run", func(t *testing.T) {
		ref := filepath.Join(root, "ref")
		sets := append(append([]string(nil), netFaultSets...), "--set", fmt.Sprintf("train.steps=%d", last),
			"--set", fmt.Sprintf("checkpoint.dir=%q", ref), "--set", "checkpoint.keep=1000000")
		r := runGorun(t, nil, append(append([]string{"--nproc-per-node=2", toml}, sets...), "--metrics", ref+".jsonl")...)
		if r.ExitCode != 0 {
			t.Fatalf("reference run: exit %d", r.ExitCode)
		}
		for _, row := range rows {
			if row.compareStep == 0 {
				continue
			}
			step := checkpoint.StepName(int64(row.compareStep))
			got := filepath.Join(row.dir, step)
			rep, err := checkpoint.CompareDirs(context.Background(), got, filepath.Join(ref, step), allClose)
			if err != nil {
				t.Errorf("%s: %v", row.name, err)
				continue
			}
			worst := 0.0
			for _, tr := range rep.Tensors {
				if !tr.Close {
					t.Errorf("%s: %s tensor %s not within %v of the fault-free run: max |diff| %.3g", row.name, step, tr.Name, allClose, tr.MaxAbs)
				}
				worst = max(worst, tr.MaxAbs)
			}
			t.Logf("%s: %s allclose to the fault-free run, max |diff| %.1e", row.name, step, worst)
		}
	})
}

// runNetScenario runs one job through one fault and measures it: it starts etcd and the three
// agents in their namespaces, waits for step netFaultStep, drops sc.rules for sc.dur, heals,
// waits for the whole world to train again after the heal and write a checkpoint a period
// later, then stops the job with SIGUSR1 (every worker checkpoints and exits 75).
func runNetScenario(t *testing.T, lab *netLab, toml, dir string, sc netScenario) netRow {
	t.Helper()
	row := netRow{name: sc.name, dir: filepath.Join(dir, "ckpt"), rejoin: -1}
	metricsPath := filepath.Join(dir, "metrics.jsonl")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	etcdAddr := lab.Addr("etcd") + ":2379"
	// Every process lasts the fault's duration longer than a run of gorun may otherwise.
	within := runTimeout + sc.dur
	etcd := startProcWithin(t, within, "etcd", "ip", nil, lab.Exec("etcd", gorunBin, "rendezvous", "serve", "--listen="+etcdAddr,
		"--peer-listen="+lab.Addr("etcd")+":2380", "--data-dir="+filepath.Join(dir, "etcd"))...)
	waitFor(t, 30*time.Second, "etcd serving", func() bool {
		return strings.Contains(etcd.stderr.String()+etcd.stdout.String(), "serving etcd v3 at")
	})
	var agents []*gorunProc
	for i, n := range []string{"a", "b", "c"} {
		args := []string{gorunBin, "--nnodes=2:3", "--nproc-per-node=2", "--rdzv-backend=etcd", "--rdzv-endpoint=" + etcdAddr,
			"--rdzv-id=netfault", "--node-name=node-" + n, fmt.Sprintf("--node-rank=%d", i), "--local-addr=" + lab.Addr(n),
			"--max-restarts=5", "--term-timeout=5s",
			fmt.Sprintf("--rdzv-conf=lease_ttl=%d,last_call_timeout=1,join_timeout=60", int(netLeaseTTL.Seconds())), toml}
		args = append(append(args, netFaultSets...), "--set", fmt.Sprintf("checkpoint.dir=%q", row.dir), "--metrics", metricsPath)
		agents = append(agents, startProcWithin(t, within, "node-"+n, "ip", nil, lab.Exec(n, args...)...))
	}
	dump := func() {
		for _, a := range append([]*gorunProc{etcd}, agents...) {
			t.Logf("%s stdout:\n%s\n%s stderr:\n%s", a.name, harness.Tail(a.stdout.String(), 15), a.name, harness.Tail(a.stderr.String(), 40))
		}
	}
	read := func() []metrics.Record {
		recs, _ := metrics.ReadFile(metricsPath)
		return recs
	}
	alive := func() bool {
		for _, a := range agents {
			select {
			case <-a.done:
				return false
			default:
			}
		}
		return true
	}
	if !waitFor(t, 90*time.Second, fmt.Sprintf("step %d at world size 6", netFaultStep), func() bool {
		recs := read()
		return len(recs) > 0 && recs[len(recs)-1].Step >= netFaultStep && recs[len(recs)-1].WorldSize == 6 || !alive()
	}) || !alive() {
		dump()
		t.Fatalf("%s: the job did not reach step %d with all three nodes", sc.name, netFaultStep)
	}

	faultAt := time.Now()
	lab.Drop(sc.rules(lab)...)
	for h, d := range sc.delays {
		lab.Delay(h, d)
	}
	time.Sleep(sc.dur) // the fault's own duration: the one fixed wait
	lab.Heal()
	healAt := time.Now()
	t.Logf("%s: fault from %s to %s", sc.name, faultAt.Format("15:04:05.000"), healAt.Format("15:04:05.000"))

	// Back in the job: a record of the whole world written after the heal and after every record
	// of a smaller world. Then a checkpoint of the whole world a period later, to compare.
	var target int
	backOK := waitFor(t, 30*time.Second, "every node back in the job", func() bool {
		recs := read()
		lastSmall := time.Time{}
		for _, r := range recs {
			if r.WorldSize < 6 && r.Time.After(lastSmall) {
				lastSmall = r.Time
			}
		}
		for _, r := range recs {
			if r.WorldSize == 6 && r.Time.After(healAt) && r.Time.After(lastSmall) {
				target = (r.Step/netEvery + 2) * netEvery
				return true
			}
		}
		return !alive()
	}) && alive()
	if backOK {
		backOK = waitFor(t, 30*time.Second, fmt.Sprintf("checkpoint step %d", target), func() bool {
			_, err := os.Stat(filepath.Join(row.dir, checkpoint.StepName(int64(target)), "manifest.json"))
			return err == nil || !alive()
		}) && alive()
	}
	if !backOK {
		// A job that did not recover may not checkpoint either: stop it (SIGTERM, then SIGKILL
		// after stopGrace) well inside the processes' time bound, so that what failed is reported, not a timeout.
		dump()
		row.notes = append(row.notes, "the job did not get all three nodes back and a checkpoint after the heal (stopped with SIGTERM)")
		for _, a := range agents {
			a.cancel()
		}
	}
	for _, a := range agents {
		if backOK && a.cmd.ProcessState == nil {
			_ = a.cmd.Process.Signal(syscall.SIGUSR1)
		}
	}
	for _, a := range agents {
		r := a.wait()
		if backOK && r.ExitCode != 75 {
			row.notes = append(row.notes, fmt.Sprintf("%s exited %d, want 75 (checkpointed on SIGUSR1)", a.name, r.ExitCode))
		}
	}
	if backOK {
		row.compareStep = target
	}

	recs, err := metrics.ReadFile(metricsPath)
	if err != nil {
		t.Fatal(err)
	}
	hist := metrics.History(recs)
	row.redone = len(recs) - len(hist)
	for i, r := range hist {
		if r.Step != i+1 {
			row.notes = append(row.notes, fmt.Sprintf("the job's line of steps has step %d at place %d: want each of steps 1..%d once, in order", r.Step, i+1, len(hist)))
			break
		}
	}
	byTime := slices.Clone(recs)
	sort.SliceStable(byTime, func(i, j int) bool { return byTime[i].Time.Before(byTime[j].Time) })
	var firstSmall, lastSmall time.Time
	during := 0 // records written during the fault
	for i, r := range byTime {
		if i > 0 && !r.Time.Before(faultAt.Add(-time.Second)) {
			row.stall = max(row.stall, r.Time.Sub(byTime[i-1].Time))
		}
		if r.WorldSize < 6 && r.Time.After(faultAt) {
			if !row.left {
				firstSmall = r.Time
			}
			row.left, lastSmall = true, r.Time
		}
		if r.Time.After(faultAt) && r.Time.Before(healAt) {
			during++
		}
	}
	if row.left {
		row.rejoin = -1
		for _, r := range byTime {
			if r.WorldSize == 6 && r.Time.After(lastSmall) {
				row.rejoin = r.Time.Sub(healAt)
				break
			}
		}
	}
	rounds := map[int]int{}
	for _, r := range recs {
		rounds[r.Round] = max(rounds[r.Round], r.WorldSize)
	}
	left := "no"
	if row.left {
		left = fmt.Sprintf("%v after the fault began (a record at a smaller world)", firstSmall.Sub(faultAt).Round(time.Millisecond))
	}
	t.Logf("%s: %d records, %d steps (%d during the fault), stall %.2f s, redone %d, left %s, rejoin %v after the heal, rounds (round: world size) %v",
		sc.name, len(recs), len(hist), during, row.stall.Seconds(), row.redone, left, row.rejoin.Round(time.Millisecond), rounds)
	return row
}

// waitFor polls cond every 20 ms until it holds (true) or d passes (false, logged with what).
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Logf("no %s within %v", what, d)
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
