package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gorun/gorun/bench/benchproc"
	"github.com/gorun/gorun/trainer/metrics"
)

// slots is how many agents a job runs at once: nodes (the --nnodes maximum) plus one spare.
const (
	nodes = 4
	slots = nodes + 1
)

// agent is one gorun agent of a job: a node, in one of the job's slots.
type agent struct {
	slot int
	name string
	cmd  *exec.Cmd
	done chan struct{}
	// stopped: SIGSTOPped with its workers (a silent node), until killed.
	stopped bool
}

func (a *agent) alive() bool {
	select {
	case <-a.done:
		return false
	default:
		return true
	}
}

// fault is one failure injected into a job.
type fault struct {
	Kind   string
	At     time.Time
	Victim string // the node (or worker) it hit
	// Skipped says why nothing was injected (e.g. no aggregator found): the fault is left out
	// of the figures.
	Skipped string
	// Bystander says the fault hit no member of the round (the etcd leader's node was a spare,
	// or down): the training world goes on in the same round.
	Bystander bool
}

// job is one run of the chaos job: its agents, files and the faults injected into it.
type job struct {
	b       *bench
	name    string
	runID   string
	period  time.Duration // 0: fault-free
	dir     string
	ckpt    string
	metrics string
	agents  [slots]*agent
	gen     int // replacement agents started so far
	faults  []fault
	// pending are actions due later: a stopped node's kill and replacement, an etcd member's
	// restart, a replacement agent's start.
	pending []pendingAction
	rng     *rand.Rand
	bag     []string
	start   time.Time // the first record of the whole world: the faults' clock starts here
	end     time.Time
	// straggle: a straggler run, one node slowed from slowAfter after the start; evict: its
	// agents run with --evict-stragglers=evictAfter.
	straggle, evict bool
	slow            *slowdown
}

type pendingAction struct {
	at time.Time
	do func()
}

// Fault kinds, in the order the table lists them.
const (
	kindWorker     = "kill -9 of one worker"
	kindNode       = "kill -9 of a node"
	kindStop       = "SIGSTOP of a node"
	kindAggregator = "kill -9 of the aggregator's node"
	kindEtcdLeader = "kill -9 of the etcd leader's node"
)

var kinds = []string{kindWorker, kindNode, kindStop, kindAggregator, kindEtcdLeader}

func newJob(b *bench, name string, period time.Duration) (*job, error) {
	dir := filepath.Join(b.dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return &job{b: b, name: name, runID: fmt.Sprintf("chaos-%s-%d", name, time.Now().UnixNano()%1e9), period: period, dir: dir,
		ckpt: filepath.Join(dir, "ckpt"), metrics: filepath.Join(dir, "metrics.jsonl"),
		rng: rand.New(rand.NewPCG(b.seed, uint64(period)))}, nil
}

// startAgent starts an agent in slot (a replacement when the slot had one before).
func (j *job) startAgent(slot int) error {
	name := fmt.Sprintf("node%d", slot)
	if j.agents[slot] != nil {
		j.gen++
		name = fmt.Sprintf("node%d-r%d", slot, j.gen)
	}
	log, err := os.Create(filepath.Join(j.b.dir, "logs", j.name+"-"+name+".log"))
	if err != nil {
		return err
	}
	args := []string{fmt.Sprintf("--nnodes=2:%d", nodes), "--nproc-per-node=2", "--rdzv-backend=etcd",
		"--rdzv-endpoint=" + joinComma(j.b.etcd.endpoints()), "--rdzv-id=" + j.runID, "--node-name=" + name,
		"--local-addr=127.0.0.1", "--max-restarts=1000", "--term-timeout=5s",
		"--rdzv-conf=lease_ttl=2,last_call_timeout=1,max_membership_changes=1000"}
	if j.evict {
		args = append(args, "--evict-stragglers="+evictAfter.String())
	}
	args = append(args, j.b.toml)
	args = append(append(args, j.b.sets...), "--set", fmt.Sprintf("checkpoint.dir=%q", j.ckpt), "--metrics", j.metrics)
	cmd := exec.Command(j.b.gorun, args...)
	cmd.Env = append(os.Environ(), markerEnv+"="+j.b.marker, "TMPDIR="+filepath.Join(j.b.dir, "tmp"))
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("%s: starting %s: %w", j.name, name, err)
	}
	a := &agent{slot: slot, name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(a.done)
	}()
	j.agents[slot] = a
	return nil
}

func joinComma(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ","
		}
		out += x
	}
	return out
}

// records reads the job's metrics file (none yet: nil).
func (j *job) records() []metrics.Record {
	recs, _ := metrics.ReadFile(j.metrics)
	return recs
}

// run runs the job: its agents, until the whole world trained a step (the start), then
// duration more, injecting a fault every period (at period/2, 3 period/2, ...), then stops it
// with SIGUSR1 (every worker checkpoints and exits 75).
func (j *job) run(ctx context.Context) error {
	for s := range slots {
		if err := j.startAgent(s); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(120 * time.Second)
	for j.start.IsZero() {
		recs := j.records()
		if i := slices.IndexFunc(recs, func(r metrics.Record) bool { return r.WorldSize == 2*nodes }); i >= 0 {
			j.start = recs[i].Time // the first record of the whole world
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s: no step of the whole world (%d workers) within 120 s (logs in %s)", j.name, 2*nodes, filepath.Join(j.b.dir, "logs"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	j.b.logf("%s: training at world size %d from %s; %v of it", j.name, 2*nodes, j.start.Format("15:04:05.000"), j.b.duration)
	next := j.start.Add(j.period / 2)
	stopAt := j.start.Add(j.b.duration)
	smoke := j.b.smoke && j.period > 0
	var sm smokeState
	for (smoke || time.Now().Before(stopAt)) && ctx.Err() == nil {
		now := time.Now()
		if smoke {
			done, err := sm.step(ctx, j, now)
			if err != nil {
				j.end = time.Now()
				j.stop()
				return err
			}
			if done {
				break
			}
		} else if j.period > 0 && !now.Before(next) {
			j.inject(ctx)
			next = next.Add(j.period)
		}
		if j.straggle && j.slow == nil && now.Sub(j.start) >= slowAfter {
			sl, err := j.slowNode(ctx)
			if err != nil {
				j.stop()
				return err
			}
			j.slow = sl
			j.b.logf("%s: %s slowed (its workers stopped %v, continued %v, in turn)", j.name, sl.node, slowOff, slowOn)
		}
		j.runPending(now)
		time.Sleep(20 * time.Millisecond)
	}
	j.end = time.Now()
	if j.slow != nil {
		j.slow.stop()
		ev, err := j.evictions(ctx)
		if err != nil {
			j.stop()
			return err
		}
		if len(ev) > 0 {
			j.slow.evicted = ev[0]
		}
		j.b.logf("%s: evictions: %+v", j.name, ev)
	}
	for len(j.pending) > 0 { // a stopped node is killed, a member restarted; no agent started
		due := j.pending
		j.pending = nil
		for _, p := range due {
			p.do()
		}
	}
	j.stop()
	return ctx.Err()
}

// runPending runs the pending actions due at now.
func (j *job) runPending(now time.Time) {
	var due, later []pendingAction
	for _, p := range j.pending {
		if !now.Before(p.at) {
			due = append(due, p)
		} else {
			later = append(later, p)
		}
	}
	j.pending = later
	for _, p := range due { // an action may add another
		p.do()
	}
}

// stop ends the job: SIGUSR1 to every live agent (the workers checkpoint and exit 75), up to
// 60 s for them to exit, then SIGTERM, then SIGKILL.
func (j *job) stop() {
	for _, a := range j.agents {
		if a != nil && a.stopped {
			benchproc.SignalTree(a.cmd.Process.Pid, syscall.SIGKILL)
		}
	}
	// The members' workers checkpoint and exit 75 (a hot spare waits on: it gets SIGTERM after).
	members := j.members(context.Background())
	for _, a := range j.agents {
		if a != nil && a.alive() {
			_ = a.cmd.Process.Signal(syscall.SIGUSR1)
		}
	}
	wait := func(d time.Duration, agents []*agent) bool {
		deadline := time.Now().Add(d)
		for _, a := range agents {
			select {
			case <-a.done:
			case <-time.After(time.Until(deadline)):
				return false
			}
		}
		return true
	}
	if !wait(60*time.Second, members) {
		j.b.logf("%s: members still running 60 s after SIGUSR1: SIGTERM", j.name)
	}
	var all []*agent
	for _, a := range j.agents {
		if a != nil {
			all = append(all, a)
		}
	}
	for _, a := range j.agents {
		if a != nil && a.alive() {
			_ = a.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	if !wait(15*time.Second, all) {
		for _, a := range j.agents {
			if a != nil && a.alive() {
				benchproc.SignalTree(a.cmd.Process.Pid, syscall.SIGKILL)
			}
		}
		wait(10*time.Second, all)
	}
}

// draw is the next fault kind: the kinds in a seeded random order, each once before any
// repeats (a bag), so that a short run still sees every kind.
func (j *job) draw() string {
	if len(j.bag) == 0 {
		j.bag = append([]string(nil), kinds...)
		j.rng.Shuffle(len(j.bag), func(a, b int) { j.bag[a], j.bag[b] = j.bag[b], j.bag[a] })
	}
	k := j.bag[0]
	j.bag = j.bag[1:]
	return k
}

// members are the agents in the job's round now, as gorun status says it: alive, not
// stopped, with workers. A waiting spare (a hot one has workers too) is none.
func (j *job) members(ctx context.Context) []*agent {
	inRound, err := j.roundMembers(ctx)
	if err != nil {
		j.b.logf("%s: %v", j.name, err)
		return nil
	}
	var out []*agent
	var why []string
	for _, a := range j.agents {
		if a == nil {
			continue
		}
		ws := 0
		if a.alive() {
			ws = len(benchproc.WorkersOf(a.cmd.Process.Pid, j.runID))
		}
		if a.alive() && !a.stopped && inRound[a.name] && ws > 0 {
			out = append(out, a)
		}
		why = append(why, fmt.Sprintf("%s: alive %v, stopped %v, in the round %v, %d workers", a.name, a.alive(), a.stopped, inRound[a.name], ws))
	}
	if len(out) == 0 {
		j.b.logf("%s: no member node with workers (gorun status: %d live members): %s", j.name, len(inRound), strings.Join(why, "; "))
	}
	return out
}

// roundMembers are the node names of the round's members whose agent's lease lives, from
// `gorun status --json`.
func (j *job) roundMembers(ctx context.Context) (map[string]bool, error) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, j.b.gorun, "status", "--json", "--rdzv-endpoint="+joinComma(j.b.etcd.endpoints()), "--rdzv-id="+j.runID).Output()
	if err != nil {
		return nil, fmt.Errorf("gorun status --json --rdzv-id=%s: %w", j.runID, err)
	}
	var st struct {
		Members []struct {
			Host  string `json:"host"`
			Alive bool   `json:"alive"`
		} `json:"members"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("gorun status --json --rdzv-id=%s: %w", j.runID, err)
	}
	m := map[string]bool{}
	for _, x := range st.Members {
		if x.Alive {
			m[x.Host] = true
		}
	}
	return m, nil
}

// replaceLater starts a replacement agent in slot after d, as SLURM requeueing the node would.
func (j *job) replaceLater(slot int, d time.Duration) {
	j.pending = append(j.pending, pendingAction{at: time.Now().Add(d), do: func() {
		if time.Now().After(j.end) && !j.end.IsZero() {
			return
		}
		if err := j.startAgent(slot); err != nil {
			j.b.logf("%s: %v", j.name, err)
		}
	}})
}

// requeueDelay is how long after a node's death its replacement agent starts.
const requeueDelay = 1 * time.Second

// stopHold is how long a SIGSTOPped node stays stopped before it is killed and replaced: past
// the lease TTL (2 s), so the job has gone on without it.
const stopHold = 5 * time.Second

// etcdRestart is how long a killed etcd member stays down before its node brings it back.
const etcdRestart = 3 * time.Second

// inject injects the next fault of the mix.
func (j *job) inject(ctx context.Context) {
	kind := j.draw()
	f := fault{Kind: kind, At: time.Now()}
	members := j.members(ctx)
	killNode := func(a *agent) {
		benchproc.SignalTree(a.cmd.Process.Pid, syscall.SIGKILL)
		f.Victim = a.name
		j.replaceLater(a.slot, requeueDelay)
	}
	switch kind {
	case kindWorker:
		if len(members) == 0 {
			f.Skipped = "no node with workers"
			break
		}
		a := members[j.rng.IntN(len(members))]
		ws := benchproc.WorkersOf(a.cmd.Process.Pid, j.runID)
		if len(ws) == 0 {
			f.Skipped = "its workers were gone"
			break
		}
		pid := ws[j.rng.IntN(len(ws))]
		f.At = time.Now()
		_ = syscall.Kill(pid, syscall.SIGKILL)
		f.Victim = fmt.Sprintf("a worker of %s (pid %d)", a.name, pid)
	case kindNode:
		if len(members) == 0 {
			f.Skipped = "no node with workers"
			break
		}
		f.At = time.Now()
		killNode(members[j.rng.IntN(len(members))])
	case kindStop:
		if len(members) == 0 {
			f.Skipped = "no node with workers"
			break
		}
		a := members[j.rng.IntN(len(members))]
		f.At = time.Now()
		benchproc.SignalTree(a.cmd.Process.Pid, syscall.SIGSTOP)
		a.stopped = true
		f.Victim = a.name
		j.pending = append(j.pending, pendingAction{at: time.Now().Add(stopHold), do: func() {
			benchproc.SignalTree(a.cmd.Process.Pid, syscall.SIGKILL)
			a.stopped = false
			j.replaceLater(a.slot, 0)
		}})
	case kindAggregator:
		pid, err := j.b.etcd.aggregatorPid(ctx, j.runID)
		if err != nil {
			f.Skipped = err.Error()
			break
		}
		var victim *agent
		for _, a := range j.agents {
			if a != nil && a.cmd.Process.Pid == pid && a.alive() && !a.stopped {
				victim = a
			}
		}
		if victim == nil {
			f.Skipped = fmt.Sprintf("the aggregator (pid %d) is no agent of the job that runs", pid)
			break
		}
		f.At = time.Now()
		killNode(victim)
	case kindEtcdLeader:
		i, err := j.b.etcd.leaderMember(ctx)
		if err != nil {
			f.Skipped = err.Error()
			break
		}
		m := j.b.etcd.members[i]
		f.At = time.Now()
		_ = m.cmd.Process.Kill()
		if a := j.agents[i]; a != nil && a.alive() {
			f.Bystander = !slices.Contains(members, a)
			killNode(a) // the node hosting member i: slot i
			f.Victim = fmt.Sprintf("%s with etcd member %s", a.name, m.name)
			if f.Bystander {
				f.Victim += " (a spare or a stopped node)"
			}
		} else {
			f.Bystander = true
			f.Victim = "etcd member " + m.name + " (its node was down)"
		}
		j.pending = append(j.pending, pendingAction{at: time.Now().Add(etcdRestart), do: func() {
			<-m.done
			if err := j.b.etcd.start(m, j.b.etcd.initialCluster()); err != nil {
				j.b.logf("%s: restarting etcd member %s: %v", j.name, m.name, err)
			}
		}})
	}
	if f.Skipped != "" {
		j.b.logf("%s: %s: skipped: %s", j.name, kind, f.Skipped)
	} else {
		j.b.logf("%s: %s %s: %s", j.name, f.At.Format("15:04:05.000"), kind, f.Victim)
	}
	j.faults = append(j.faults, f)
}
