package slurmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/proc/procfs"
	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/test/harness"
)

// Net is the lab subnet: node i is Net.i. The shared lab scripts default
// to 127.0.100, so a cluster of ours does not meet theirs.
const Net = "127.0.171"

const (
	// lockName is the machine-wide lock file (in os.TempDir) that keeps
	// two test processes from running two clusters at once.
	lockName = "gorun-slurmtest.lock"
	// lockWait bounds how long Start waits for another test's cluster.
	lockWait = 6 * time.Minute
	// scriptTimeout bounds slurm-up.sh and slurm-down.sh.
	scriptTimeout = 2 * time.Minute
	// commandTimeout bounds one SLURM client command.
	commandTimeout = 30 * time.Second
)

// Cluster is a running lab cluster of Nodes nodes, node1..nodeN. Its
// methods fail the test (t.Fatal) when SLURM does not answer.
type Cluster struct {
	Nodes  int    // node1..nodeN
	LabDir string // everything of this cluster lives under it
	Conf   string // SLURM_CONF
	lab    string // the lab scripts
	lock   *os.File
}

// Proc is one process of the cluster.
type Proc struct {
	PID     int
	Cmdline string
}

func (p Proc) String() string { return fmt.Sprintf("%d %s", p.PID, p.Cmdline) }

// Available says why a cluster cannot start here (not root, a SLURM
// package missing), or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (slurmd, per-node namespaces)")
	}
	var missing []string
	for _, prog := range []string{"slurmctld", "slurmd", "srun", "sbatch", "scontrol", "scancel", "squeue", "sinfo",
		"munged", "munge", "unmunge", "unshare", "nsenter", "ss"} {
		if _, err := exec.LookPath(prog); err != nil {
			missing = append(missing, prog)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s (apt-get install slurm-wlm munge)", strings.Join(missing, ", "))
	}
	return nil
}

// SkipUnlessAvailable skips t when Available fails, or fails it when
// CI=true.
func SkipUnlessAvailable(t testing.TB) {
	t.Helper()
	if err := Available(); err != nil {
		testutil.SkipOrFail(t, "no SLURM cluster here: %v", err)
	}
}

// Start starts a cluster of nodes nodes and waits until they are idle. It
// skips t (fails it when CI=true) when the cluster cannot run here, waits
// for any other test's cluster to stop first, and in t.Cleanup fails t if
// a job process is left on a node, stops every daemon and checks that
// none survived.
func Start(t testing.TB, nodes int) *Cluster {
	t.Helper()
	SkipUnlessAvailable(t)
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("slurmtest: cannot find the lab scripts")
	}
	c := &Cluster{Nodes: nodes, lab: filepath.Join(filepath.Dir(self), "lab")}
	c.lock = lockMachine(t)
	dir, err := os.MkdirTemp("", "gorun-slurm-")
	if err != nil {
		unlock(c.lock)
		t.Fatal(err)
	}
	c.LabDir, c.Conf = dir, filepath.Join(dir, "slurm", "slurm.conf")
	t.Cleanup(func() { c.stop(t) })
	if err := os.Mkdir(c.tmpDir(), 0o700); err != nil {
		t.Fatal(err)
	}

	started := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	for attempt := 1; ; attempt++ {
		up := exec.CommandContext(ctx, filepath.Join(c.lab, "slurm-up.sh"), strconv.Itoa(nodes))
		// A first job id of its own per cluster: gorun derives ports from job
		// ids, and a run right after another must not meet its sockets.
		up.Env = append(c.Env(), "LAB_SLURM_NET="+Net, fmt.Sprintf("LAB_SLURM_FIRST_JOB_ID=%d", 1000+rand.IntN(900000)))
		stdout.Reset()
		stderr.Reset()
		up.Stdout, up.Stderr = &stdout, &stderr
		err := up.Run()
		if err == nil {
			break
		}
		if attempt == 2 {
			t.Fatalf("slurm-up.sh %d: %v\n%s", nodes, err, harness.Tail(stderr.String(), 30))
		}
		// The ports it picked were free when it looked, but another
		// process may take one before slurmctld binds it: tear down and
		// pick again.
		t.Logf("slurm-up.sh %d: %v; tearing down and trying once more", nodes, err)
		down := exec.CommandContext(ctx, filepath.Join(c.lab, "slurm-down.sh"))
		down.Env = c.Env()
		_ = down.Run()
	}
	if !strings.Contains(stdout.String(), "export SLURM_CONF="+c.Conf) {
		t.Fatalf("slurm-up.sh %d printed %q, want export SLURM_CONF=%s", nodes, stdout.String(), c.Conf)
	}
	for i := 1; i <= nodes; i++ {
		c.WaitNodeState(t, c.Node(i), 30*time.Second, "idle")
	}
	t.Logf("slurmtest: %d node(s) idle %s after Start (%s)", nodes, time.Since(started).Round(time.Millisecond), c.LabDir)
	return c
}

// lockMachine takes the machine-wide cluster lock, waiting up to lockWait.
func lockMachine(t testing.TB) *os.File {
	t.Helper()
	path := filepath.Join(os.TempDir(), lockName)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("slurmtest: lock %s: %v", path, err)
	}
	deadline := time.Now().Add(lockWait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			holder, _ := os.ReadFile(path)
			f.Close()
			t.Fatalf("slurmtest: another test's SLURM cluster holds %s (%s) after %s: %v", path, strings.TrimSpace(string(holder)), lockWait, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(fmt.Sprintf("pid %d %s\n", os.Getpid(), strings.Join(os.Args, " "))), 0)
	return f
}

func unlock(f *os.File) {
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	f.Close()
}

// stop is Start's cleanup: leftover job processes fail t; then the
// daemons stop, and anything of the cluster still running afterwards is
// killed and fails t.
func (c *Cluster) stop(t testing.TB) {
	started := time.Now()
	defer func() { t.Logf("slurmtest: cluster stopped in %s", time.Since(started).Round(time.Millisecond)) }()
	defer unlock(c.lock)
	defer os.RemoveAll(c.LabDir)
	namespaces := c.namespaces()
	if !t.Failed() && len(namespaces) > 0 {
		if left := c.waitNoJobProcs(15 * time.Second); len(left) > 0 {
			t.Errorf("slurmtest: job processes left on the nodes after the test: %v", left)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	down := exec.CommandContext(ctx, filepath.Join(c.lab, "slurm-down.sh"))
	down.Env = c.Env()
	if out, err := down.CombinedOutput(); err != nil {
		t.Errorf("slurm-down.sh: %v\n%s", err, harness.Tail(string(out), 20))
	}
	var survivors []Proc
	for _, p := range processes() {
		if slices.Contains(namespaces, p.uts) || strings.Contains(p.Cmdline, c.LabDir) {
			survivors = append(survivors, p.Proc)
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
		}
	}
	if len(survivors) > 0 {
		t.Errorf("slurmtest: processes of the cluster survived slurm-down.sh (now killed): %v", survivors)
	}
	// A node killed whole (and srun, which kills a step's leftover tasks, guard and all) leaves
	// its snapshot directory in /dev/shm, which the next gorun on that machine would sweep: this
	// cluster's gorun processes are all gone now, so sweep at once.
	launcher.SweepSnapshotDirs(launcher.DefaultShmDir, zerolog.Nop())
}

// tmpDir is the TMPDIR of everything run against the cluster: an agent
// the tests kill cannot remove its error files or its embedded etcd's
// data dir (over 100 MB), and the cluster's directory goes with it.
func (c *Cluster) tmpDir() string { return filepath.Join(c.LabDir, "tmp") }

// Env is the environment for SLURM commands against this cluster: this
// process's, without SLURM's, gorun's and the lab's own variables, plus
// SLURM_CONF, LAB_DIR and TMPDIR (inside the cluster's directory), plus
// extra (KEY=VALUE).
func (c *Cluster) Env(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, prefix := range []string{"SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "GORUN_", "PET_", "LAB_"} {
			drop = drop || strings.HasPrefix(name, prefix)
		}
		if !drop {
			env = append(env, kv)
		}
	}
	return append(append(env, "SLURM_CONF="+c.Conf, "LAB_DIR="+c.LabDir, "TMPDIR="+c.tmpDir()), extra...)
}

// Command is name args run against this cluster, in its own process
// group, which is SIGKILLed when ctx ends.
func (c *Cluster) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = c.Env()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// Run runs name args against this cluster within timeout and returns its
// combined output and exit code (-1: it did not exit by itself).
func (c *Cluster) Run(t testing.TB, timeout time.Duration, name string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := c.Command(ctx, name, args...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case ctx.Err() != nil:
		return string(out), -1
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	}
	t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	return "", -1
}

// MustRun is Run that fails t unless the command exits 0.
func (c *Cluster) MustRun(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, code := c.Run(t, commandTimeout, name, args...)
	if code != 0 {
		t.Fatalf("%s %s: exit %d\n%s", name, strings.Join(args, " "), code, harness.Tail(out, 20))
	}
	return out
}

// Node is the name of node i (1-based).
func (c *Cluster) Node(i int) string { return "node" + strconv.Itoa(i) }

// Addr is the address of node i (1-based).
func (c *Cluster) Addr(i int) string { return fmt.Sprintf("%s.%d", Net, i) }

// Sbatch submits script with args from directory dir and returns the job id.
func (c *Cluster) Sbatch(t testing.TB, dir, script string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := c.Command(ctx, "sbatch", append([]string{"--parsable", script}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sbatch %s: %v\n%s", script, err, out)
	}
	id, _, _ := strings.Cut(strings.TrimSpace(string(out)), ";")
	if _, err := strconv.Atoi(id); err != nil {
		t.Fatalf("sbatch %s printed %q, want a job id", script, out)
	}
	return id
}

// Job is one job as scontrol show job tells it: JobState, ExitCode,
// NodeList, Reason, Restarts, StdOut, ...
type Job map[string]string

// Job returns job id's fields.
func (c *Cluster) Job(t testing.TB, id string) Job {
	t.Helper()
	return parseFields(c.MustRun(t, "scontrol", "show", "job", "-o", id))
}

// WaitJob waits up to within for job id to reach one of states (RUNNING,
// COMPLETED, FAILED, ...) and returns it.
func (c *Cluster) WaitJob(t testing.TB, id string, within time.Duration, states ...string) Job {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		job := c.Job(t, id)
		if slices.Contains(states, job["JobState"]) {
			return job
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: state %s (reason %s) after %s, want %v", id, job["JobState"], job["Reason"], within, states)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// NodeState is node's state as scontrol shows it, lower case without
// flags: idle, allocated, mixed, down, ...
func (c *Cluster) NodeState(t testing.TB, node string) string {
	t.Helper()
	f := parseFields(c.MustRun(t, "scontrol", "show", "node", "-o", node))
	state, _, _ := strings.Cut(f["State"], "+")
	return strings.ToLower(state)
}

// WaitNodeState waits up to within for node to reach one of states.
func (c *Cluster) WaitNodeState(t testing.TB, node string, within time.Duration, states ...string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		state := c.NodeState(t, node)
		if slices.Contains(states, state) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: state %s after %s, want %v", node, state, within, states)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Crash kills everything on node at once (slurmd, slurmstepd, the job's
// processes: a node that died) and returns when it did.
func (c *Cluster) Crash(t testing.TB, node string) time.Time {
	t.Helper()
	at := time.Now()
	c.MustRun(t, filepath.Join(c.lab, "slurm-node.sh"), "kill", node, "crash")
	return at
}

// KillTasks sends sig to the job processes on node (not slurmd, not
// slurmstepd).
func (c *Cluster) KillTasks(t testing.TB, node string, sig syscall.Signal) {
	t.Helper()
	c.MustRun(t, filepath.Join(c.lab, "slurm-node.sh"), "kill", node, "tasks", strconv.Itoa(int(sig)))
}

// Revive starts node's slurmd again and waits until the node is idle.
func (c *Cluster) Revive(t testing.TB, node string) {
	t.Helper()
	c.MustRun(t, filepath.Join(c.lab, "slurm-node.sh"), "revive", node)
	c.WaitNodeState(t, node, 30*time.Second, "idle")
}

// NodeCommand is args run as if on node: its host name and /etc/hosts.
func (c *Cluster) NodeCommand(ctx context.Context, node string, args ...string) *exec.Cmd {
	return c.Command(ctx, filepath.Join(c.lab, "slurm-node.sh"), append([]string{"exec", node}, args...)...)
}

// NodeProcs returns the live processes on each node (by node name),
// slurmd included.
func (c *Cluster) NodeProcs() map[string][]Proc {
	byNS := map[string]string{}
	for i := 1; i <= c.Nodes; i++ {
		data, _ := os.ReadFile(filepath.Join(c.LabDir, "slurm", "run", c.Node(i)+".utsns"))
		for _, ns := range strings.Fields(string(data)) {
			byNS[ns] = c.Node(i)
		}
	}
	out := map[string][]Proc{}
	for _, p := range processes() {
		if node, ok := byNS[p.uts]; ok {
			out[node] = append(out[node], p.Proc)
		}
	}
	return out
}

// JobProcs returns the processes on the nodes other than slurmd: the
// jobs' slurmstepd and tasks.
func (c *Cluster) JobProcs() []Proc {
	var out []Proc
	for _, procs := range c.NodeProcs() {
		for _, p := range procs {
			if !strings.HasPrefix(p.Cmdline, "slurmd ") {
				out = append(out, p)
			}
		}
	}
	return out
}

// WaitNoJobProcs fails t unless every job process on the nodes is gone
// within the given time.
func (c *Cluster) WaitNoJobProcs(t testing.TB, within time.Duration) {
	t.Helper()
	if left := c.waitNoJobProcs(within); len(left) > 0 {
		t.Fatalf("job processes still on the nodes %s after the job ended: %v", within, left)
	}
}

func (c *Cluster) waitNoJobProcs(within time.Duration) []Proc {
	deadline := time.Now().Add(within)
	for {
		left := c.JobProcs()
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// namespaces lists the UTS namespaces the cluster's nodes ever used.
func (c *Cluster) namespaces() []string {
	var out []string
	files, _ := filepath.Glob(filepath.Join(c.LabDir, "slurm", "run", "node*.utsns"))
	for _, f := range files {
		data, _ := os.ReadFile(f)
		out = append(out, strings.Fields(string(data))...)
	}
	return out
}

// Listener is one listening TCP socket.
type Listener struct {
	Addr string // local address, host:port
	PIDs []int  // processes holding it
}

// Listeners returns the machine's listening TCP sockets (the lab nodes
// share the host's network namespace).
func Listeners(t testing.TB) []Listener {
	t.Helper()
	out, err := exec.Command("ss", "-ltnpH").Output()
	if err != nil {
		t.Fatalf("ss -ltnpH: %v", err)
	}
	var ls []Listener
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		l := Listener{Addr: f[3]}
		for _, part := range strings.Split(strings.Join(f[5:], " "), "pid=")[1:] {
			end := strings.IndexAny(part, ",)")
			if end < 0 {
				continue
			}
			if pid, err := strconv.Atoi(part[:end]); err == nil {
				l.PIDs = append(l.PIDs, pid)
			}
		}
		ls = append(ls, l)
	}
	return ls
}

// proc is a live process with its UTS namespace.
type proc struct {
	Proc
	uts string
}

// processes lists the live (not zombie) processes of the machine.
func processes() []proc {
	pids, _ := procfs.PIDs()
	var out []proc
	for _, pid := range pids {
		if pid == os.Getpid() {
			continue
		}
		if p, err := procfs.Stat(pid); err != nil || p.Zombie() {
			continue
		}
		uts, err := procfs.Namespace(pid, "uts")
		if err != nil {
			continue
		}
		args, _ := procfs.Cmdline(pid)
		out = append(out, proc{Proc{pid, strings.TrimSpace(strings.Join(args, " "))}, uts})
	}
	return out
}

// parseFields parses scontrol's one-line KEY=VALUE output; the first
// occurrence of a key wins.
func parseFields(s string) map[string]string {
	f := map[string]string{}
	for _, kv := range strings.Fields(s) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			if _, seen := f[k]; !seen {
				f[k] = v
			}
		}
	}
	return f
}
