package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/bench/benchproc"
)

// nodes is the job's node count (each with -nproc workers).
const nodes = 3

// way is how a job is launched and how it recovers.
type way struct {
	Name string
	// Torchrun: torch.distributed.run agents over a c10d rendezvous hosted by node 0's agent;
	// else gorun agents over the bench's etcd.
	Torchrun bool
	// Ckpt: the script writes a torch.save checkpoint every -ckpt-every steps and loads the
	// newest at start.
	Ckpt bool
	// Snapshots: gorun's snapshots on (--snapshot-replicas k); off (--snapshots=false) when false.
	Snapshots bool
	// Warm: with Snapshots, warm workers (--warm-workers): a restarted worker is an
	// interpreter that imported torch ahead of the round.
	Warm bool
	// SaveBlocks: the script saves its snapshots in every other block of this many steps only,
	// and rank 0 reports its CPU time with each step (--save-blocks): a cost run. 0: every step.
	SaveBlocks int
}

// Fault kinds.
const (
	kindWorker = "kill -9 of a worker"
	kindNode   = "kill -9 of a node"
)

var kinds = []string{kindWorker, kindNode}

// fault is one failure injected into a job.
type fault struct {
	Kind   string
	At     time.Time
	Victim string
}

// node is one launcher agent of a job, in one of its slots.
type node struct {
	slot int
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

func (n *node) alive() bool {
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// job is one run of the training script under one way: its nodes, the rank-0 events read
// from their output and the faults injected.
type job struct {
	b      *bench
	way    way
	name   string
	runID  string
	dir    string
	out    string // the script's --out
	faults bool   // inject faults
	rng    *rand.Rand
	gaps   *rand.Rand // the training time before each failure (gap): a stream of its own, the same for every way
	bag    []string

	nodes [nodes]*node
	gen   int
	pumps sync.WaitGroup
	// replacing: slots whose node was killed and whose replacement has not started yet.
	replacing map[int]time.Time

	mu     sync.Mutex // guards events, which the output readers append to
	events []event
	fault  []fault
}

func newJob(b *bench, w way, name string, faults bool) (*job, error) {
	dir := filepath.Join(b.dir, name)
	if err := os.MkdirAll(filepath.Join(dir, "ckpt"), 0o755); err != nil {
		return nil, err
	}
	return &job{b: b, way: w, name: name, runID: fmt.Sprintf("torchchaos-%s-%d", name, time.Now().UnixNano()%1e9), dir: dir,
		out: filepath.Join(dir, "final.pt"), faults: faults, rng: rand.New(rand.NewPCG(b.seed, 33)), gaps: rand.New(rand.NewPCG(b.seed, 34)), replacing: map[int]time.Time{}}, nil
}

// scriptArgs are the training script and its arguments.
func (j *job) scriptArgs() []string {
	a := []string{j.b.script, "--model-mb", strconv.FormatFloat(j.b.modelMB, 'f', -1, 64), "--steps", strconv.Itoa(j.b.steps), "--out", j.out}
	if j.way.Ckpt {
		a = append(a, "--ckpt-dir", filepath.Join(j.dir, "ckpt"), "--ckpt-every", strconv.Itoa(j.b.ckptEvery))
	}
	if j.way.SaveBlocks > 0 {
		a = append(a, "--save-blocks", strconv.Itoa(j.way.SaveBlocks))
	}
	return a
}

// command is the launcher of the node in slot, named name.
func (j *job) command(slot int, name string) *exec.Cmd {
	if j.way.Torchrun {
		// torch 1.13's torchrun under Python 3.11 needs --redirects/--tee 9:1 (a local rank
		// that does not exist) to get past a start-up crash; ranks 0 and 1 then write to the
		// agent's own stdout. Node 0's agent hosts the c10d store.
		args := []string{"-m", "torch.distributed.run", "--redirects", "9:1", "--tee", "9:1",
			fmt.Sprintf("--nnodes=%d", nodes), fmt.Sprintf("--nproc_per_node=%d", j.b.nproc), "--rdzv_backend=c10d",
			"--rdzv_endpoint=" + j.b.c10d, "--rdzv_id=" + j.runID, fmt.Sprintf("--rdzv_conf=is_host=%v", slot == 0),
			"--max_restarts=1000", "--monitor_interval=0.1"}
		return exec.Command(j.b.python, append(args, j.scriptArgs()...)...)
	}
	args := []string{fmt.Sprintf("--nnodes=%d", nodes), fmt.Sprintf("--nproc-per-node=%d", j.b.nproc), "--rdzv-backend=etcd",
		"--rdzv-endpoint=" + j.b.etcd, "--rdzv-id=" + j.runID, "--node-name=" + name, "--local-addr=127.0.0.1",
		"--max-restarts=1000", "--term-timeout=5s", "--rdzv-conf=lease_ttl=2,last_call_timeout=1,max_membership_changes=1000"}
	if j.b.snapshotFlags {
		if j.way.Snapshots {
			args = append(args, "--snapshots=true", fmt.Sprintf("--snapshot-replicas=%d", j.b.replicas))
			if j.way.Warm {
				args = append(args, "--warm-workers")
			}
		} else {
			args = append(args, "--snapshots=false")
		}
	}
	return exec.Command(j.b.gorun, append(args, j.scriptArgs()...)...)
}

// startNode starts the node of slot (a replacement when the slot had one).
func (j *job) startNode(slot int) error {
	name := fmt.Sprintf("node%d", slot)
	if j.nodes[slot] != nil {
		j.gen++
		name = fmt.Sprintf("node%d-r%d", slot, j.gen)
	}
	log, err := os.Create(filepath.Join(j.b.dir, "logs", j.name+"-"+name+".log"))
	if err != nil {
		return err
	}
	cmd := j.command(slot, name)
	cmd.Env = append(os.Environ(), markerEnv+"="+j.b.marker, "PYTHON="+j.b.python, "GLOO_SOCKET_IFNAME=lo", "OMP_NUM_THREADS=1",
		"TMPDIR="+filepath.Join(j.b.dir, "tmp"))
	outR, outW := io.Pipe()
	cmd.Stdout, cmd.Stderr = outW, outW
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("%s: starting %s: %w", j.name, name, err)
	}
	n := &node{slot: slot, name: name, cmd: cmd, done: make(chan struct{})}
	j.pumps.Add(1)
	go func() { // every line stamped as it is read: rank 0's steps are the bench's clock
		defer j.pumps.Done()
		defer log.Close()
		sc := bufio.NewScanner(outR)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			now := time.Now()
			fmt.Fprintf(log, "%s %s\n", now.Format("15:04:05.000000"), sc.Text())
			if e, ok := parseLine(now, sc.Text()); ok {
				j.mu.Lock()
				j.events = append(j.events, e)
				j.mu.Unlock()
			}
		}
		_, _ = io.Copy(io.Discard, outR)
	}()
	go func() {
		_ = cmd.Wait() // the pipe's writer closes when every process holding it has exited
		outW.Close()
		close(n.done)
	}()
	j.nodes[slot] = n
	return nil
}

// snapshot is a copy of the events so far.
func (j *job) snapshot() []event {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.events)
}

// recovered reports whether the job did a step after a restart that followed the last fault
// (or no fault was injected yet), and has done any step at all.
func (j *job) recovered(events []event) bool {
	if len(events) == 0 {
		return false
	}
	if len(j.fault) == 0 {
		return true
	}
	return !costs(j.fault[len(j.fault)-1:], events)[0].Unrecovered
}

// run starts the job, injects a fault every period of training (the first period/2 after its
// first step, each next one a period after the job's first step after the one before; in smoke
// mode one of each kind, each as soon as the job recovered), and waits for it to finish its
// steps; it leaves no process behind.
func (j *job) run(ctx context.Context) error {
	defer j.cleanup()
	began := time.Now()
	for s := range nodes {
		if err := j.startNode(s); err != nil {
			return err
		}
	}
	var next time.Time
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if j.finished() {
			break
		}
		now := time.Now()
		for s, at := range j.replacing {
			if !now.Before(at) {
				delete(j.replacing, s)
				if err := j.startNode(s); err != nil {
					return err
				}
			}
		}
		ev := j.snapshot()
		if j.faults && j.recovered(ev) && len(j.replacing) == 0 {
			done := len(j.fault) >= j.b.maxFaults || j.b.smoke && len(j.fault) == len(kinds)
			reached := 0
			for _, e := range ev {
				reached = max(reached, e.Step)
			}
			if next.IsZero() {
				next = ev[0].At.Add(j.gap())
			}
			if len(j.fault) > 0 && next.Before(j.fault[len(j.fault)-1].At) {
				// The period counts training time: the next fault comes a period after the job
				// recovered from the last one, so that recoveries longer than the period do not
				// make a fault follow each one at once (no checkpoint way could then get on).
				c := costs(j.fault[len(j.fault)-1:], ev)[0]
				next = c.At.Add(c.Recovery + j.gap())
			}
			// A fault once the first checkpoint is written (so that each way has something to
			// restore) and two steps were done since the last recovery, and none in the last two
			// steps: the job must have a step left to show its recovery.
			ready := reached >= j.b.ckptEvery+2 && stepsSince(ev, j.fault) >= 2 && reached < j.b.steps-2
			if !done && ready && (j.b.smoke || !now.Before(next)) {
				j.inject()
			}
		}
		if time.Since(began) > j.b.timeout {
			return fmt.Errorf("%s: not done %v after its start (logs in %s)", j.name, j.b.timeout, filepath.Join(j.b.dir, "logs"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, n := range j.nodes {
		if code := n.cmd.ProcessState.ExitCode(); code != 0 {
			return fmt.Errorf("%s: %s exited %d (log: %s)", j.name, n.name, code, filepath.Join(j.b.dir, "logs", j.name+"-"+n.name+".log"))
		}
	}
	j.pumps.Wait()
	if _, err := os.Stat(j.out); err != nil {
		return fmt.Errorf("%s: the job ended without its final model: %w", j.name, err)
	}
	return nil
}

// gap is the training time from the first step, or from the job's first step after the last
// failure, to the next failure: drawn uniformly from half a period to one and a half, so that
// failures fall anywhere in a checkpoint interval. A fixed period had them land at the same
// point of each interval (a checkpoint way restarts at a checkpoint, and a period later it was
// about to write the next), which made its steps redone near their maximum every time.
func (j *job) gap() time.Duration {
	return j.b.period/2 + time.Duration(j.gaps.Int64N(int64(j.b.period)))
}

// finished reports whether every node of the job has exited with no replacement due.
func (j *job) finished() bool {
	if len(j.replacing) > 0 {
		return false
	}
	for _, n := range j.nodes {
		if n.alive() {
			return false
		}
	}
	return true
}

// draw is the next fault kind: the kinds in a seeded random order, each once before any
// repeats, so that a short run sees each.
func (j *job) draw() string {
	if len(j.bag) == 0 {
		j.bag = slices.Clone(kinds)
		j.rng.Shuffle(len(j.bag), func(a, b int) { j.bag[a], j.bag[b] = j.bag[b], j.bag[a] })
	}
	k := j.bag[0]
	j.bag = j.bag[1:]
	return k
}

// inject kills a worker or a node (its agent and every process under it) with SIGKILL; a
// killed node's slot gets a replacement agent requeueDelay later, as a SLURM requeue of the
// node would, so that the job goes on at the same world size (and so the same data order).
// The torchrun way never loses node 0: its agent hosts the c10d store, without which no
// torchrun agent can go on.
func (j *job) inject() {
	kind := j.draw()
	var alive []*node
	for _, n := range j.nodes {
		if n.alive() && !(kind == kindNode && j.way.Torchrun && n.slot == 0) {
			alive = append(alive, n)
		}
	}
	if len(alive) == 0 {
		j.bag = append([]string{kind}, j.bag...) // the same kind on the next tick
		return
	}
	// One node drawn and one scan of its process tree: on a loaded machine a scan takes the
	// driver a while, and the job goes on meanwhile.
	n := alive[j.rng.IntN(len(alive))]
	ws := benchproc.WorkersOf(n.cmd.Process.Pid, j.runID)
	if len(ws) == 0 { // between rounds: tried again on the next tick
		j.bag = append([]string{kind}, j.bag...)
		return
	}
	f := fault{Kind: kind}
	switch kind {
	case kindWorker:
		pid := ws[j.rng.IntN(len(ws))]
		f.At = time.Now()
		_ = syscall.Kill(pid, syscall.SIGKILL)
		f.Victim = fmt.Sprintf("a worker of %s (pid %d)", n.name, pid)
	case kindNode:
		f.At = time.Now()
		benchproc.SignalTree(n.cmd.Process.Pid, syscall.SIGKILL)
		f.Victim = n.name
		j.replacing[n.slot] = f.At.Add(requeueDelay)
	}
	j.b.logf("%s: %s %s: %s", j.name, f.At.Format("15:04:05.000"), kind, f.Victim)
	j.fault = append(j.fault, f)
}

// stepsSince is how many steps were done after the last fault (all of them when none was).
func stepsSince(events []event, faults []fault) int {
	n := 0
	for _, e := range events {
		if !e.Restored && (len(faults) == 0 || e.At.After(faults[len(faults)-1].At)) {
			n++
		}
	}
	return n
}

// requeueDelay is how long after a node's death its replacement agent starts.
const requeueDelay = time.Second

// cleanup kills what is left of the job's process trees and removes the per-job memory that
// a SIGKILLed gorun agent leaves in /dev/shm (its guard died with it: nobody else removes it).
func (j *job) cleanup() {
	for _, n := range j.nodes {
		if n != nil && n.alive() {
			benchproc.SignalTree(n.cmd.Process.Pid, syscall.SIGKILL)
			<-n.done
		}
	}
	left, _ := filepath.Glob("/dev/shm/gorun-" + j.runID + "-*")
	for _, d := range left {
		if err := os.RemoveAll(d); err != nil {
			j.b.logf("%s: removing %s: %v", j.name, d, err)
		}
	}
	if len(left) > 0 {
		j.b.logf("%s: removed %d snapshot directories of killed agents from /dev/shm", j.name, len(left))
	}
}
