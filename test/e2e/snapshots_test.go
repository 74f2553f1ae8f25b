package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/internal/snapshot"
	"github.com/gorun/gorun/internal/snapshot/durable"
	pythonpkg "github.com/gorun/gorun/python"
	"github.com/gorun/gorun/test/harness"
)

// PyTorch snapshots (issue 33) under real gorun agents: the DDP example
// examples/pytorch/snapshots.py (gloo on CPU, a 2 MB model) saves a
// snapshot every step in the agent's per-job directory, and a worker that
// gorun restarts goes on from the step the agents agreed on.

// snapSteps is how many steps the example trains: enough that a kill
// after snapKillAt lands in the middle of training.
const (
	snapSteps  = 400
	snapKillAt = 40
)

func snapshotsScript() string {
	return filepath.Join(moduleRoot, "examples", "pytorch", "snapshots.py")
}

// snapshotArgs are the example's arguments, writing its final state_dict
// to out.
func snapshotArgs(out string, extra ...string) []string {
	return append([]string{snapshotsScript(), "--model-mb", "2", "--steps", strconv.Itoa(snapSteps), "--out", out}, extra...)
}

// agreement is one of the agent's "snapshots: ..." log lines (JSON):
// what the agents agreed before a round's workers started.
type agreement struct {
	Message string `json:"message"`
	Round   int    `json:"round"`
	Restore bool   `json:"restore"`
	Step    uint64 `json:"step"`
	Newest  uint64 `json:"newest"`
	Redone  uint64 `json:"redone"`
	Reason  string `json:"reason"`
}

// agreements parses the agreement lines of an agent's stderr.
func agreements(stderr string) []agreement {
	var out []agreement
	for _, l := range strings.Split(stderr, "\n") {
		var a agreement
		if json.Unmarshal([]byte(l), &a) == nil && strings.HasPrefix(a.Message, "snapshots: ") && strings.Contains(l, `"restore"`) {
			out = append(out, a)
		}
	}
	return out
}

// requireSameModel fails unless the state_dicts (or tensors) torch.save
// wrote at ref and got hold the same tensors, bit for bit.
func requireSameModel(t *testing.T, ref, got string) {
	t.Helper()
	if err := harness.SameModel(torch.Python, ref, got); err != nil {
		t.Fatal(err)
	}
}

// requireNoShm fails when /dev/shm holds a snapshot directory of run id.
func requireNoShm(t *testing.T, runID string) {
	t.Helper()
	left, _ := filepath.Glob(filepath.Join("/dev/shm", "gorun-"+runID+"-*"))
	if len(left) > 0 {
		t.Errorf("snapshot directories left in /dev/shm: %v", left)
		for _, d := range left {
			_ = os.RemoveAll(d)
		}
	}
}

// waitUntil waits until cond holds, or p exits (then it says whether cond
// holds by then), bounded by runTimeout.
func waitUntil(p *gorunProc, cond func() bool) bool {
	deadline := time.After(runTimeout)
	for !cond() {
		select {
		case <-p.done:
			return cond()
		case <-deadline:
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
	return true
}

// workerOf is the live worker of global rank rank among the processes p
// started (a warm worker still waiting for its round is none: its RANK is
// a placeholder's).
func (p *gorunProc) workerOf(rank int) (harness.Proc, bool) {
	for _, w := range harness.Marked(markerEnv + "=" + p.marker) {
		if w.Comm == pythonpkg.WarmComm {
			continue
		}
		if v, ok := w.Getenv("RANK"); ok && v == strconv.Itoa(rank) {
			return w, true
		}
	}
	return harness.Proc{}, false
}

// startAndKillRank1 starts the example as a 2-worker job of run id id
// (--max-restarts=1, flags added), writing its final model to got, and
// kills its rank 1 with SIGKILL once rank 0 said step snapKillAt; it
// returns the job and the worker it killed.
func startAndKillRank1(t *testing.T, id, got string, flags ...string) (*gorunProc, harness.Proc) {
	t.Helper()
	args := append([]string{"--standalone", "--nproc-per-node=2", "--max-restarts=1", "--rdzv-id=" + id}, flags...)
	p := startGorun(t, "gorun", ddpEnv, append(args, snapshotArgs(got)...)...)
	if !p.waitOutput(runTimeout, func(out string) bool { return strings.Contains(out, fmt.Sprintf("step %d loss", snapKillAt)) }) {
		p.wait()
		t.Fatalf("training never reached step %d", snapKillAt)
	}
	w, ok := p.workerOf(1)
	if !ok {
		t.Fatal("no worker of rank 1 running")
	}
	if err := syscall.Kill(w.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	return p, w
}

// A worker killed with SIGKILL in the middle of training: gorun restarts
// the node's workers, the agent agrees on the step every rank holds (the
// state is replicated, so the newest any rank saved: no step redone) and
// the workers go on from it; the final model is bit-identical to a
// fault-free run's, and no snapshot directory is left in /dev/shm. The
// fault-free run has --snapshots=false, which gives the workers no
// snapshot directory (the example then trains as under torchrun). The same
// again with --warm-workers (warmWorkerKill), and a job stopped and run
// again with --snapshot-durable (stoppedAndRunAgain), against the same
// fault-free run.
func TestSnapshotsWorkerKill(t *testing.T) {
	torch.Require(t)
	dir := t.TempDir()
	ref, got := filepath.Join(dir, "ref.pt"), filepath.Join(dir, "got.pt")
	id := "snap-kill-" + newMarker(t)

	r := runGorun(t, ddpEnv, "--standalone", "--nproc-per-node=2", "--rdzv-id="+id+"-ref", "--snapshots=false", snapshotsScript(),
		"--model-mb", "2", "--steps", strconv.Itoa(snapSteps), "--out", ref)
	if r.ExitCode != 0 {
		t.Fatalf("fault-free run: exit %d", r.ExitCode)
	}
	if a := agreements(r.Stderr); len(a) > 0 || strings.Contains(r.Stderr, "gorun snapshots:") {
		t.Errorf("--snapshots=false: the agent agreed on snapshots or a worker saw a directory: %v", a)
	}

	p, _ := startAndKillRank1(t, id, got)
	// The restarted workers run with the agreed step in their
	// environment, from the snapshot directory's copy of the package.
	var rec agreement
	if !waitUntil(p, func() bool {
		a := agreements(p.stderr.String())
		if len(a) < 2 {
			return false
		}
		rec = a[1]
		return true
	}) {
		p.wait()
		t.Fatal("no agreement after the kill")
	}
	// The agreement is logged before the round's workers start: wait for
	// a worker of each rank started with the agreed step in its
	// environment (the old ones had none to restore).
	agreedStep := strconv.FormatUint(rec.Step, 10)
	restarted := func(rank int) (harness.Proc, bool) {
		for _, w := range harness.Marked(markerEnv + "=" + p.marker) {
			r, _ := w.Getenv("RANK")
			s, _ := w.Getenv("GORUN_SNAPSHOT_STEP")
			if r == strconv.Itoa(rank) && s == agreedStep {
				return w, true
			}
		}
		return harness.Proc{}, false
	}
	if !waitUntil(p, func() bool {
		_, ok0 := restarted(0)
		_, ok1 := restarted(1)
		return ok0 && ok1
	}) {
		p.wait()
		t.Fatalf("no restarted workers of ranks 0 and 1 with GORUN_SNAPSHOT_STEP=%s", agreedStep)
	}
	for rank := range 2 {
		w, _ := restarted(rank)
		dir, _ := w.Getenv("GORUN_SNAPSHOT_DIR")
		step, _ := w.Getenv("GORUN_SNAPSHOT_STEP")
		verified, _ := w.Getenv("GORUN_SNAPSHOT_VERIFIED")
		path, _ := w.Getenv("PYTHONPATH")
		if !strings.HasPrefix(dir, "/dev/shm/gorun-"+id+"-") || step != strconv.FormatUint(rec.Step, 10) || verified != "1" || !strings.HasPrefix(path, dir+"/python") {
			t.Errorf("rank %d restarted with GORUN_SNAPSHOT_DIR=%q GORUN_SNAPSHOT_STEP=%q GORUN_SNAPSHOT_VERIFIED=%q PYTHONPATH=%q; want the agreed step %d from a directory of the run, and its python/ first",
				rank, dir, step, verified, path, rec.Step)
		}
	}
	res := p.wait()
	if res.ExitCode != 0 {
		t.Fatalf("exit %d after the worker kill, want 0", res.ExitCode)
	}
	agreed := agreements(res.Stderr)
	if len(agreed) != 2 || agreed[0].Restore || !agreed[1].Restore {
		t.Fatalf("want two agreements, none at the start and a restore after the kill; got %+v", agreed)
	}
	rec = agreed[1]
	if rec.Step < snapKillAt || rec.Redone > 1 {
		t.Errorf("restored step %d (newest any rank had %d, %d redone): want at least step %d and at most 1 redone", rec.Step, rec.Newest, rec.Redone, snapKillAt)
	}
	if !strings.Contains(res.Stdout, fmt.Sprintf("restored step %d\n", rec.Step)) {
		t.Errorf("rank 0 did not say it restored step %d", rec.Step)
	}
	t.Logf("worker kill: restored step %d, newest any rank had %d, %d steps redone", rec.Step, rec.Newest, rec.Redone)
	requireSameModel(t, ref, got)
	requireNoShm(t, id)
	requireNoShm(t, id+"-ref")
	t.Run("warm workers", func(t *testing.T) { warmWorkerKill(t, ref) })
	t.Run("stopped, then run again", func(t *testing.T) { stoppedAndRunAgain(t, ref) })
}

// An agent killed with SIGKILL leaves no snapshot directory, and no
// directory of its workers' error files, behind: its guard, which
// outlives it, kills its workers and then removes both.
func TestSnapshotsGoWithAKilledAgent(t *testing.T) {
	torch.Require(t)
	id := "snap-agent-kill-" + newMarker(t)
	p := startGorun(t, "gorun", ddpEnv, append([]string{"--standalone", "--nproc-per-node=1", "--rdzv-id=" + id},
		snapshotArgs(filepath.Join(t.TempDir(), "out.pt"))...)...)
	if !p.waitOutput(runTimeout, func(out string) bool { return strings.Contains(out, "step 5 loss") }) {
		p.wait()
		t.Fatal("training never reached step 5")
	}
	dirs, _ := filepath.Glob(filepath.Join("/dev/shm", "gorun-"+id+"-*"))
	if len(dirs) != 1 {
		t.Fatalf("want one snapshot directory of the run in /dev/shm, found %v", dirs)
	}
	errorDirs, _ := filepath.Glob(filepath.Join(p.tmpDir, "gorun-"+id+"-*"))
	if len(errorDirs) != 1 {
		t.Fatalf("want one error-file directory of the run in gorun's TMPDIR, found %v", errorDirs)
	}
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.done
	// The guard reads the end of its input once gorun is gone; then it
	// kills the workers, removes the directories, and exits.
	gone := func() bool {
		_, err := os.Stat(dirs[0])
		_, errorErr := os.Stat(errorDirs[0])
		return os.IsNotExist(err) && os.IsNotExist(errorErr) && len(listMarked(p.marker)) == 0
	}
	deadline := time.After(runTimeout)
	for !gone() {
		select {
		case <-deadline:
			t.Fatalf("%s or %s still there, or processes of the run alive (%v), after gorun was killed", dirs[0], errorDirs[0], listMarked(p.marker))
		case <-time.After(50 * time.Millisecond):
		}
	}
	requireNoShm(t, id)
}

// shardedSteps and shardedPace: the sharded job's length and the pace of
// its steps (a real step lasts far longer than its snapshot's copy);
// shardedPause: the step after which each rank stops itself, once (not
// a multiple of the durable subtest's durableEvery, so that the durable
// directory's newest step is older than the memory's).
const (
	shardedSteps = 80
	shardedPace  = "0.02"
	shardedPause = 55
)

func shardedScript() string {
	return filepath.Join(moduleRoot, "test", "e2e", "testdata", "snapshots", "sharded.py")
}

// shardedJob is three agents of one worker each over one etcd running
// testdata/snapshots/sharded.py, whose ranks each keep state of their own.
type shardedJob struct {
	t        *testing.T
	endpoint string
	id, out  string
	agents   []*gorunProc
	extra    []string // more gorun flags for every agent
	pause    bool     // each rank stops itself after step shardedPause, once
}

func newShardedJob(t *testing.T, endpoint, id string) *shardedJob {
	return &shardedJob{t: t, endpoint: endpoint, id: id, out: t.TempDir()}
}

// start starts one more agent, named name.
func (j *shardedJob) start(name string) *gorunProc {
	args := append([]string(nil), "--nnodes=3", "--nproc-per-node=1", "--max-restarts=3", "--snapshot-replicas=1",
		"--rdzv-endpoint="+j.endpoint, "--rdzv-id="+j.id, "--node-name="+name, "--local-addr=127.0.0.1",
		"--rdzv-conf=lease_ttl=2,last_call_timeout=1")
	script := []string{shardedScript(), "--steps", strconv.Itoa(shardedSteps), "--step-sleep", shardedPace, "--out", j.out}
	if j.pause {
		script = append(script, "--pause-at", strconv.Itoa(shardedPause))
	}
	p := startGorun(j.t, name, ddpEnv, append(append(args, j.extra...), script...)...)
	j.agents = append(j.agents, p)
	return p
}

// worker is the one worker of agent p: its process, global rank and node rank.
type nodeWorker struct {
	agent          *gorunProc
	proc           harness.Proc
	rank, nodeRank int
}

func (j *shardedJob) workers() []nodeWorker {
	var out []nodeWorker
	for _, p := range j.agents {
		for _, w := range harness.Marked(markerEnv + "=" + p.marker) {
			rank, ok1 := w.Getenv("RANK")
			group, ok2 := w.Getenv("GROUP_RANK")
			if ok1 && ok2 {
				r, _ := strconv.Atoi(rank)
				g, _ := strconv.Atoi(group)
				out = append(out, nodeWorker{agent: p, proc: w, rank: r, nodeRank: g})
			}
		}
	}
	return out
}

// snapDir is agent p's snapshot directory.
func (j *shardedJob) snapDir(p *gorunProc) string {
	return filepath.Join("/dev/shm", fmt.Sprintf("gorun-%s-%d", j.id, p.cmd.Process.Pid))
}

// newestSnapshot is the newest complete step of rank in dir; -1: none.
func newestSnapshot(dir string, rank int) int64 {
	s, err := snapshot.Newest(snapshot.Paths(dir, rank)[0], snapshot.Paths(dir, rank)[1])
	if err != nil {
		return -1
	}
	return int64(s.Step)
}

// durableStep is the newest step at which the durable directory dst holds
// a complete, verified copy of every one of world ranks; -1: none.
func durableStep(dst string, world int) int64 {
	held, _ := durable.Scan(dst)
	return commonStep(held, world)
}

// commonStep is the newest step of which held has a copy of every one of
// world ranks; -1: none.
func commonStep(held []snapshot.Holding, world int) int64 {
	ranks := map[uint64]map[int]bool{}
	for _, h := range held {
		if ranks[h.Step] == nil {
			ranks[h.Step] = map[int]bool{}
		}
		ranks[h.Step][h.Rank] = true
	}
	newest := int64(-1)
	for step, rs := range ranks {
		if len(rs) == world {
			newest = max(newest, int64(step))
		}
	}
	return newest
}

// corruptDurable flips a byte in the payload of every copy of rank's
// snapshots in the durable directory dst of step from or later (rank's
// node is gone: its copies change no more), and returns their paths. A
// survivor may still complete a newer copy of its own rank, so the step
// a restore agrees on can grow: damaging every copy of rank from the
// newest common step on makes whatever step is agreed on from then on
// find a corrupt copy, until only older ones are left.
func corruptDurable(t *testing.T, dst string, rank int, from int64) []string {
	t.Helper()
	held, err := durable.Scan(dst)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, h := range held {
		if h.Rank != rank || int64(h.Step) < from {
			continue
		}
		f, err := os.OpenFile(h.Path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 1)
		_, rerr := f.ReadAt(b, snapshot.HeaderSize+8)
		b[0] ^= 0xff
		_, werr := f.WriteAt(b, snapshot.HeaderSize+8)
		if err := errors.Join(rerr, werr, f.Close()); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, h.Path)
	}
	if len(paths) == 0 {
		t.Fatalf("the durable directory %s has no copy of rank %d of step %d or later: %+v", dst, rank, from, held)
	}
	return paths
}

// requireStatusShowsRecovery waits until gorun status --json shows, for
// a member, the snapshots its agent published (every 2 s): a rank's
// newest step and a recovery that restored a step; it fails when the job
// ends first.
func (j *shardedJob) requireStatusShowsRecovery() {
	j.t.Helper()
	var last string
	shown := func() bool {
		last = runGorun(j.t, nil, "status", "--json", "--rdzv-endpoint="+j.endpoint, "--rdzv-id="+j.id).Stdout
		var st struct {
			Members []struct {
				Snapshots *struct {
					Ranks    []struct{ Step uint64 } `json:"ranks"`
					Recovery *struct {
						Restored bool   `json:"restored"`
						Step     uint64 `json:"step"`
					} `json:"recovery"`
				} `json:"snapshots"`
			} `json:"members"`
		}
		if json.Unmarshal([]byte(last), &st) != nil {
			return false
		}
		for _, m := range st.Members {
			if s := m.Snapshots; s != nil && len(s.Ranks) > 0 && s.Recovery != nil && s.Recovery.Restored && s.Recovery.Step > 0 {
				return true
			}
		}
		return false
	}
	if !waitUntil(j.agents[len(j.agents)-1], shown) {
		j.t.Errorf("gorun status never showed a member's snapshots and its recovery before the job ended; last:\n%s", last)
	}
}

// killNode kills every process of agent p at once (its gorun, guard and
// worker: the machine is gone) and removes its snapshot directory, as the
// machine's memory goes with it.
func (j *shardedJob) killNode(p *gorunProc) {
	j.t.Helper()
	dir := j.snapDir(p)
	for _, q := range harness.Marked(markerEnv + "=" + p.marker) {
		_ = syscall.Kill(q.PID, syscall.SIGKILL)
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	for len(listMarked(p.marker)) > 0 {
		killMarked(p.marker)
		time.Sleep(10 * time.Millisecond)
	}
	if err := os.RemoveAll(dir); err != nil {
		j.t.Fatal(err)
	}
}

// Node loss with a copy of each rank's snapshots on the next node
// (--snapshot-replicas=1) and state that is each rank's own (sharded): with
// every worker paused at a step (each stops itself there) and the copies
// caught up, one whole node is killed
// (agent, guard, worker; its memory gone) and a new node takes its place.
// Its rank restores from the copy on the node after it, every rank goes on
// from the same step (at most 1 redone), and every rank's final state is
// bit-identical to a fault-free run's. With two nodes killed, one rank's
// copies are all gone: the agents say so, the workers restore nothing (the
// script's own fallback: here, from the start) and still end identical.
// With --snapshot-durable as well, the two nodes' loss is restored from
// the durable directory: the newest step every rank has there, the steps
// since redone, and the final states still bit-identical. When a lost
// rank's copy of that step is corrupt, the round that would restore it
// fails (the agent that finds the bad CRC puts the file aside) and the
// next restores the newest step every rank has apart from it.
func TestSnapshotsNodeLoss(t *testing.T) {
	torch.Require(t)
	endpoint := etcdtest.Start(t).Endpoints()[0]
	ref := newShardedJob(t, endpoint, "snap-ref-"+newMarker(t))
	for _, n := range nodeNames(3) {
		ref.start(n)
	}
	for i, r := range waitAll(ref.agents) {
		if r.ExitCode != 0 {
			t.Fatalf("fault-free run: node %d exit %d", i, r.ExitCode)
		}
	}
	for _, tc := range []struct {
		name    string
		kills   int  // nodes killed: the one with rank `victim` and, with 2, the next (which holds its copy)
		durable bool // --snapshot-durable, every durableEvery steps
		corrupt bool // the lost rank's durable copy of the newest step every rank has there is damaged
	}{
		{"one node, restored from its copy", 1, false, false},
		{"two nodes, both copies gone", 2, false, false},
		{"two nodes, restored from the durable directory", 2, true, false},
		{"two nodes, the durable copy corrupt: the step before", 2, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const durableEvery = 10
			j := newShardedJob(t, endpoint, "snap-loss-"+newMarker(t))
			j.pause = true
			dst := filepath.Join(t.TempDir(), "durable")
			if tc.durable {
				// Three kept: a step older than the one made corrupt is there for every rank.
				j.extra = []string{"--snapshot-durable=" + dst, "--snapshot-durable-every=" + strconv.Itoa(durableEvery), "--snapshot-durable-keep=3"}
			}
			for _, n := range nodeNames(3) {
				j.start(n)
			}
			// Every rank stops itself once its snapshot of step
			// shardedPause is complete (testdata/snapshots/sharded.py).
			var ws []nodeWorker
			paused := func() bool {
				ws = j.workers()
				if len(ws) != 3 {
					return false
				}
				for _, w := range ws {
					if !harness.Stopped(w.proc.PID) {
						return false
					}
				}
				return true
			}
			if !waitUntil(j.agents[0], paused) {
				t.Fatalf("the 3 workers never all paused at step %d (found %d)", shardedPause, len(ws))
			}
			if tc.durable && !waitUntil(j.agents[0], func() bool { return durableStep(dst, 3) > 0 }) {
				t.Fatalf("the durable directory %s never held a step of every rank", dst)
			}
			byNodeRank := map[int]nodeWorker{}
			for _, w := range ws {
				byNodeRank[w.nodeRank] = w
			}
			victim := byNodeRank[1]
			next := byNodeRank[2]
			// The copy of the victim's rank on the next node catches up
			// with the victim's own newest snapshot.
			own := newestSnapshot(j.snapDir(victim.agent), victim.rank)
			if !waitUntil(next.agent, func() bool { return newestSnapshot(j.snapDir(next.agent), victim.rank) == own }) {
				t.Fatalf("the copy of rank %d on node rank 2 never reached step %d", victim.rank, own)
			}
			j.killNode(victim.agent)
			if tc.kills == 2 {
				j.killNode(next.agent)
			}
			// The survivor's copy of its paused rank may still complete a
			// newer step in the durable directory: the restore is at this
			// step or later.
			durableAtKill := durableStep(dst, 3)
			var corrupted []string // the victim's durable copies damaged
			if tc.corrupt {
				corrupted = corruptDurable(t, dst, victim.rank, durableAtKill)
			}
			survivor := byNodeRank[0]
			newestAtKill := int64(-1)
			for r := range 3 {
				newestAtKill = max(newestAtKill, newestSnapshot(j.snapDir(survivor.agent), r))
			}
			for _, w := range ws {
				_ = syscall.Kill(w.proc.PID, syscall.SIGCONT)
			}
			for i := range tc.kills {
				j.start(fmt.Sprintf("new%d", i))
			}
			if tc.kills == 1 {
				j.requireStatusShowsRecovery()
			}
			var agreed []agreement
			for _, p := range j.agents {
				if p == victim.agent || tc.kills == 2 && p == next.agent {
					continue
				}
				if r := p.wait(); r.ExitCode != 0 {
					t.Errorf("%s: exit %d, want 0", p.name, r.ExitCode)
				}
				a := agreements(p.stderr.String())
				if len(a) < 2 && !strings.HasPrefix(p.name, "new") { // a new node's first round is the one after the loss
					t.Errorf("%s: want an agreement after the loss, got %+v", p.name, a)
					continue
				}
				agreed = append(agreed, a[len(a)-1])
			}
			for _, a := range agreed {
				switch {
				case tc.kills == 1 && (!a.Restore || a.Redone > 1 || a.Step == 0):
					t.Errorf("after one node lost: %+v; want a restore, at most 1 step redone", a)
				case tc.corrupt:
					if !a.Restore || !strings.Contains(a.Message, "from the durable directory") || int64(a.Step) >= durableAtKill || a.Step%durableEvery != 0 {
						t.Errorf("after two nodes lost, rank %d's durable copies of step %d on corrupt: %+v; want a restore from the durable directory of an older multiple of %d",
							victim.rank, durableAtKill, a, durableEvery)
					}
				case tc.durable && (!a.Restore || !strings.Contains(a.Message, "from the durable directory") ||
					int64(a.Step) < durableAtKill || a.Step%durableEvery != 0 || int64(a.Newest) < newestAtKill || a.Redone != a.Newest-a.Step || a.Redone == 0):
					t.Errorf("after two nodes lost, with --snapshot-durable: %+v; want a restore from the durable directory of step %d or a later multiple of %d, newest (%d or more) - that step redone",
						a, durableAtKill, durableEvery, newestAtKill)
				case tc.kills == 2 && !tc.durable && (a.Restore || !strings.Contains(a.Reason, fmt.Sprintf("snapshot of rank %d", victim.rank))):
					t.Errorf("after two nodes lost: %+v; want no restore, and why: rank %d's snapshots are gone", a, victim.rank)
				}
			}
			if len(agreed) > 0 {
				t.Logf("%s: %s", tc.name, agreed[0].Message)
			}
			if tc.durable {
				said := false // a restored worker's own line (python/gorun, GORUN_SNAPSHOT_REASON)
				for _, p := range j.agents {
					said = said || strings.Contains(p.stderr.String(), "gorun snapshots: restoring step ") && strings.Contains(p.stderr.String(), "from the durable directory (")
				}
				if !said {
					t.Error("no worker said that its restore came from the durable directory")
				}
			}
			if tc.corrupt {
				// Each corrupt copy a round agreed on: the agent that loaded it
				// said why its round failed, and put it aside.
				found := 0
				for _, c := range corrupted {
					said := false
					for _, p := range j.agents {
						said = said || strings.Contains(p.stderr.String(), "durable: load of "+c+": snapshot: payload corrupt")
					}
					_, err := os.Stat(c + ".corrupt")
					switch {
					case said && err == nil:
						found++
					case said:
						t.Errorf("an agent found %s corrupt and did not put it aside: %v", c, err)
					}
				}
				if found == 0 {
					t.Errorf("no agent found any of the corrupt durable copies %q", corrupted)
				}
				t.Logf("%d of the %d corrupt copies found and put aside", found, len(corrupted))
			}
			if tc.kills == 1 {
				fetched := false
				for _, p := range j.agents {
					fetched = fetched || strings.Contains(p.stderr.String(), "snapshot put in place for its rank")
				}
				if !fetched {
					t.Error("no agent put a snapshot in place from another node")
				}
			}
			for r := range 3 {
				requireSameModel(t, filepath.Join(ref.out, fmt.Sprintf("rank-%d.pt", r)), filepath.Join(j.out, fmt.Sprintf("rank-%d.pt", r)))
			}
			requireNoShm(t, j.id)
		})
	}
	requireNoShm(t, ref.id)
}
