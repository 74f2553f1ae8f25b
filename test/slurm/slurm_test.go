package slurmtest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/test/harness"
)

// Bad input to gorun sbatch is one line on stderr and exit 2; needs no cluster.
func TestSbatchBadInput(t *testing.T) {
	dir := tempDir(t)
	entry := writeFile(t, dir, "train.py", "print('hi')\n", 0o644)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"both gpus and nproc", []string{entry, "--nodes", "2", "--gpus-per-node", "8", "--nproc-per-node", "8", "--time", "10"}, "not both"},
		{"neither gpus nor nproc", []string{entry, "--nodes", "2", "--time", "10"}, "--gpus-per-node G"},
		{"bad time", []string{entry, "--nodes", "2", "--nproc-per-node", "2", "--time", "2h"}, "--time"},
		{"no time", []string{entry, "--nodes", "2", "--nproc-per-node", "2"}, "--time"},
		{"zero nodes", []string{entry, "--nodes", "0", "--nproc-per-node", "2", "--time", "10"}, "--nodes=0"},
		{"no nodes", []string{entry, "--nproc-per-node", "2", "--time", "10"}, "--nodes=0"},
		{"missing entrypoint file", []string{filepath.Join(dir, "nope.py"), "--nodes", "2", "--nproc-per-node", "2", "--time", "10"}, "no such file"},
		{"no entrypoint", []string{"--nodes", "2", "--nproc-per-node", "2", "--time", "10"}, "no entrypoint"},
		{"two entrypoints", []string{entry, entry, "--nodes", "2", "--nproc-per-node", "2", "--time", "10"}, "one entrypoint"},
		{"min nodes above nodes", []string{entry, "--nodes", "2", "--min-nodes", "3", "--nproc-per-node", "2", "--time", "10"}, "--min-nodes=3"},
		{"unknown flag", []string{entry, "--nodes", "2", "--nproc-per-node", "2", "--time", "10", "--gpus", "2"}, "unknown flag --gpus"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(gorun(t), append([]string{"sbatch"}, tt.args...)...)
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit)
			require.Equal(t, 2, exit.ExitCode(), "stderr: %s", stderr.String())
			require.Empty(t, stdout.String())
			msg := strings.TrimRight(stderr.String(), "\n")
			require.NotContains(t, msg, "\n", "one line")
			require.Contains(t, msg, tt.want)
		})
	}
}

// The shipped examples/slurm scripts are what gorun sbatch renders today
// from their "# Rendered by:" line, below their own header; needs no cluster.
func TestShippedExamplesAreRendered(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(moduleRoot, "examples", "slurm", "*.sbatch"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			text := readFile(t, f)
			_, rendered, ok := strings.Cut(text, "\n# Rendered by: ")
			require.True(t, ok, "%s has no '# Rendered by:' line", f)
			command, _, _ := strings.Cut(rendered, "\n")
			args := strings.Fields(command) // the examples quote nothing
			require.Equal(t, []string{"gorun", "sbatch"}, args[:2])
			cmd := exec.Command(gorun(t), args[1:]...)
			cmd.Dir = moduleRoot
			out, err := cmd.Output()
			require.NoError(t, err, "%s", command)
			_, want, _ := strings.Cut(string(out), "\n# Rendered by: ")
			require.Equal(t, want, rendered, "%s differs from what %q renders now", f, command)
			require.True(t, strings.HasPrefix(text, "#!/bin/bash\n"))
		})
	}
}

// Two nodes of two workers under a real srun: ranks, world size, group
// ranks, the master on node1's address, and every socket gorun listens on
// bound to a node's address, none to 0.0.0.0.
func TestSrunTwoNodes(t *testing.T) {
	c := Start(t, 2)
	out := tempDir(t)
	worker := `echo "RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE GROUP_RANK=$GROUP_RANK MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT MASTER_IP=$(getent hosts "$MASTER_ADDR" | cut -d' ' -f1) HOST=$(hostname)"
touch "$OUT/ready-$RANK"; while [ ! -e "$OUT/go" ]; do sleep 0.05; done`

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srun := c.Command(ctx, "srun", "-N2", "--ntasks-per-node=1", "--export=ALL,OUT="+out,
		gorun(t), "--nproc-per-node=2", "--", "/bin/sh", "-c", worker)
	var output testutil.SyncBuffer
	srun.Stdout, srun.Stderr = &output, &output
	require.NoError(t, srun.Start())
	exited := make(chan error, 1)
	go func() { exited <- srun.Wait() }()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if files, _ := filepath.Glob(filepath.Join(out, "ready-*")); len(files) == 4 {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("srun ended before its workers were ready: %v\n%s", err, output.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			<-exited
			t.Fatalf("the 4 workers were not ready after 60s:\n%s", output.String())
		}
	}

	// Every listening socket of the job's processes is on a node's address.
	jobPIDs := map[int]string{}
	for _, p := range c.JobProcs() {
		jobPIDs[p.PID] = p.Cmdline
	}
	nodeAddrs := []string{c.Addr(1), c.Addr(2)}
	var onNode1 int
	for _, l := range Listeners(t) {
		for _, pid := range l.PIDs {
			cmdline, ok := jobPIDs[pid]
			if !ok {
				continue
			}
			host, _, err := net.SplitHostPort(l.Addr)
			require.NoError(t, err)
			require.Contains(t, nodeAddrs, host, "pid %d (%s) listens on %s, not on a node's address", pid, cmdline, l.Addr)
			if host == c.Addr(1) {
				onNode1++
			}
		}
	}
	require.Positive(t, onNode1, "nothing of the job listens on node1 (%s): the embedded etcd should", c.Addr(1))

	released := time.Now()
	require.NoError(t, os.WriteFile(filepath.Join(out, "go"), nil, 0o644))
	require.NoError(t, <-exited, "srun:\n%s", output.String())
	res := output.String()
	t.Logf("workers released to srun's exit: %s", time.Since(released).Round(10*time.Millisecond))
	for _, l := range strings.Split(res, "\n") {
		if strings.Contains(l, "other nodes still registered") {
			t.Logf("a node waited for the others to leave until its linger ran out: %s", l)
		}
	}

	line := regexp.MustCompile(`(?m)^\[(node\d):(\d+)\] RANK=(\d+) LOCAL_RANK=(\d+) WORLD_SIZE=(\d+) GROUP_RANK=(\d+) MASTER_ADDR=(\S+) MASTER_PORT=(\d+) MASTER_IP=(\S*) HOST=(\S+)$`)
	matches := line.FindAllStringSubmatch(res, -1)
	require.Len(t, matches, 4, "srun output:\n%s", res)
	ports := map[string]bool{}
	seen := map[int]bool{}
	for _, m := range matches {
		prefixHost, rank := m[1], atoi(t, m[3])
		require.Equal(t, m[2], m[3], "the output prefix names the rank")
		require.False(t, seen[rank], "rank %d twice", rank)
		seen[rank] = true
		require.Equal(t, strconv.Itoa(rank%2), m[4], "LOCAL_RANK of rank %d", rank)
		require.Equal(t, "4", m[5], "WORLD_SIZE")
		require.Equal(t, strconv.Itoa(rank/2), m[6], "GROUP_RANK of rank %d (SLURM_NODEID order)", rank)
		require.Equal(t, c.Node(rank/2+1), prefixHost, "rank %d runs on node%d", rank, rank/2+1)
		require.Equal(t, prefixHost, m[10], "the worker's host name")
		require.Equal(t, "node1", m[7], "MASTER_ADDR")
		require.Equal(t, c.Addr(1), m[9], "MASTER_ADDR resolves to node1's address on every node")
		ports[m[8]] = true
	}
	require.Len(t, ports, 1, "one MASTER_PORT")
	c.WaitNoJobProcs(t, 15*time.Second)
}

// gorun refuses to run as two tasks of one node, under a real srun -n2 -N1.
func TestTwoTasksOnOneNodeRefused(t *testing.T) {
	c := Start(t, 1)
	out, code := c.Run(t, 60*time.Second, "srun", "-N1", "-n2", gorun(t), "--nproc-per-node=1", "--", "/bin/true")
	require.Equal(t, 2, code, "srun:\n%s", out)
	require.Contains(t, out, "SLURM started 2 gorun tasks on node node1")
	require.Contains(t, out, "srun --ntasks-per-node=1 gorun")
	c.WaitNoJobProcs(t, 15*time.Second)
}

// signalWorker records the signals a worker gets in files under $OUT.
const signalWorker = `#!/bin/sh
trap 'echo usr1 >> "$OUT/usr1-$RANK"' USR1
trap 'echo term >> "$OUT/term-$RANK"; exit 143' TERM
echo $$ > "$OUT/ready-$RANK"
while :; do sleep 0.1; done
`

// scancel --signal=USR1 reaches every worker of a job from the rendered
// script, which keeps running; scancel -s TERM then stops the workers
// gracefully (they see SIGTERM) and gorun exits 143.
func TestScancelSignals(t *testing.T) {
	c := Start(t, 2)
	dir := tempDir(t)
	worker := writeFile(t, dir, "worker.sh", signalWorker, 0o755)
	script := writeFile(t, dir, "job.sbatch", render(t, worker, "--nodes", "2", "--nproc-per-node", "2", "--time", "10",
		"--output", dir, "--env", "OUT="+dir, "--", "--term-timeout=20s"), 0o644)
	id := c.Sbatch(t, dir, script)
	defer func() {
		if t.Failed() {
			out, _ := os.ReadFile(c.Job(t, id)["StdOut"])
			t.Logf("job output:\n%s", harness.Tail(string(out), 40))
		}
	}()
	waitFiles(t, filepath.Join(dir, "ready-*"), 4, 60*time.Second)

	c.MustRun(t, "scancel", "--signal=USR1", id)
	usr1 := waitFiles(t, filepath.Join(dir, "usr1-*"), 4, 20*time.Second)
	time.Sleep(500 * time.Millisecond) // a second delivery, if any, lands by now
	for _, f := range usr1 {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		t.Logf("%s: SIGUSR1 seen %d time(s)", filepath.Base(f), strings.Count(string(data), "usr1"))
	}
	require.Equal(t, "RUNNING", c.Job(t, id)["JobState"], "the job goes on after SIGUSR1")
	workers := 0
	for _, p := range c.JobProcs() {
		if strings.HasPrefix(p.Cmdline, "/bin/sh "+worker) {
			workers++
		}
	}
	require.Equal(t, 4, workers, "the 4 workers still run after SIGUSR1")

	c.MustRun(t, "scancel", "-s", "TERM", id)
	job := c.WaitJob(t, id, 40*time.Second, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
	terms := waitFiles(t, filepath.Join(dir, "term-*"), 4, 5*time.Second)
	require.Len(t, terms, 4, "every worker saw SIGTERM")
	output := readFile(t, job["StdOut"])
	require.Equal(t, "143:0", job["ExitCode"], "srun's exit status is gorun's: 128+SIGTERM\n%s", output)
	for _, task := range []string{"node1: task 0", "node2: task 1"} {
		require.Contains(t, output, task+": Exited with exit code 143")
	}
	c.WaitNoJobProcs(t, 15*time.Second)
}

// The rendered script of the DDP example on 3 nodes of one worker with
// --min-nodes 2: one node crashes mid-run; the job goes on with 2 nodes
// (world size 2) and completes, srun returning 0 (--no-kill). Prints how
// long each step of the recovery took, from when lines appeared in the
// job's output; then the crashed node comes back.
func TestSbatchElasticNodeCrash(t *testing.T) {
	torch.Require(t)
	c := Start(t, 3)
	dir := tempDir(t)
	script := writeFile(t, dir, "ddp.sbatch", render(t, filepath.Join(moduleRoot, "examples", "ddp", "train.py"),
		"--nodes", "3", "--min-nodes", "2", "--nproc-per-node", "1", "--time", "10", "--output", dir, "--job-name", "ddp",
		"--env", "PYTHON="+python), 0o644)
	require.Contains(t, readFile(t, script), "--nnodes=2:3")
	ddpOut := filepath.Join(dir, "ddp")
	submitted := time.Now()
	id := c.Sbatch(t, dir, script, "--steps", "60", "--step-sleep", "0.2", "--log-every", "10", "--out", ddpOut)
	output := filepath.Join(dir, "ddp-"+id+".out")
	w := watch(t, output)

	w.wait(t, "training on 3 nodes", 90*time.Second, func(l string) bool {
		return strings.Contains(l, "] step 10 loss") && strings.HasSuffix(l, "world_size 3")
	})
	crashed := c.Crash(t, "node3")
	stopped := w.wait(t, "gorun stops the workers", 30*time.Second, func(l string) bool {
		return strings.Contains(l, `"component":"agent","from":"running"`) && strings.Contains(l, `"to":"stopping"`)
	})
	running := w.wait(t, "next round runs on 2 nodes", 30*time.Second, func(l string) bool {
		return strings.Contains(l, `"to":"running"`) && strings.Contains(l, `"world_size":2`)
	})
	var envOK time.Time
	for i := 0; i < 2; i++ {
		envOK = w.wait(t, "2 workers of round 1 started", 60*time.Second, func(l string) bool {
			return strings.Contains(l, "env ok:") && strings.Contains(l, "world_size=2") && strings.Contains(l, "restart_count=1")
		})
	}
	resumed := w.wait(t, "training resumed", 60*time.Second, func(l string) bool {
		return strings.Contains(l, "] step 0 loss") && strings.HasSuffix(l, "world_size 2")
	})
	finished := w.wait(t, "training done", 60*time.Second, func(l string) bool { return strings.Contains(l, "] done: ") })
	job := c.WaitJob(t, id, 90*time.Second, "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
	ended := time.Now()
	text := readFile(t, output)
	require.Equal(t, "COMPLETED", job["JobState"], "job output:\n%s", harness.Tail(text, 40))
	require.Equal(t, "0:0", job["ExitCode"], "srun returns 0 with --no-kill")
	require.Contains(t, text, "done: 60 steps, world_size 2")
	slurmSaw := w.seen(func(l string) bool { return strings.Contains(l, "Node failure on node3") })

	var digests []string
	for rank := 0; rank < 2; rank++ {
		var r struct {
			WorldSize int    `json:"world_size"`
			SHA256    string `json:"sha256"`
		}
		require.NoError(t, json.Unmarshal([]byte(readFile(t, filepath.Join(ddpOut, fmt.Sprintf("rank-%d.json", rank)))), &r))
		require.Equal(t, 2, r.WorldSize, "rank %d", rank)
		digests = append(digests, r.SHA256)
	}
	require.Len(t, slices.Compact(digests), 1, "replicas end bit-identical: %v", digests)
	require.NoFileExists(t, filepath.Join(ddpOut, "rank-2.json"), "the run of 3 did not finish")

	ms := func(at time.Time) string { return at.Sub(crashed).Round(10 * time.Millisecond).String() }
	t.Logf("node3 crashed at 0: gorun stopped the workers %s, round 1 (2 nodes, world 2) running %s, its 2 workers started %s, training resumed %s; SLURM reported the node failure %s",
		ms(stopped), ms(running), ms(envOK), ms(resumed), ms(slurmSaw))
	t.Logf("submitted to training on 3 nodes %s; training done to job ended %s", crashed.Sub(submitted).Round(10*time.Millisecond), ended.Sub(finished).Round(100*time.Millisecond))
	if l := w.line(func(l string) bool { return strings.Contains(l, "other nodes still registered") }); l != "" {
		t.Logf("a node waited for the others to leave until its linger ran out: %s", l)
	}
	if r := w.seen(func(l string) bool { return strings.Contains(l, `"round ended: rejoining"`) }); !r.IsZero() {
		t.Logf("gorun's reason: %s", w.line(func(l string) bool { return strings.Contains(l, `"round ended: rejoining"`) }))
	}
	c.WaitNoJobProcs(t, 15*time.Second)
	c.Revive(t, "node3")
}

// outputWatch follows a growing file and remembers when each line first
// appeared (polled every 50 ms).
type outputWatch struct {
	mu    sync.Mutex
	lines []string
	times []time.Time
	next  int // where the next wait starts
	done  chan struct{}
	wg    sync.WaitGroup
}

func watch(t *testing.T, path string) *outputWatch {
	w := &outputWatch{done: make(chan struct{})}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		var offset int64
		var partial string
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			if f, err := os.Open(path); err == nil {
				if _, err := f.Seek(offset, 0); err == nil {
					r := bufio.NewReader(f)
					for {
						s, err := r.ReadString('\n')
						offset += int64(len(s))
						if err != nil {
							partial += s
							break
						}
						now := time.Now()
						w.mu.Lock()
						w.lines = append(w.lines, strings.TrimRight(partial+s, "\n"))
						w.times = append(w.times, now)
						w.mu.Unlock()
						partial = ""
					}
				}
				f.Close()
			}
			select {
			case <-w.done:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { close(w.done); w.wg.Wait() })
	return w
}

// index returns the first line matching match at or after line from.
func (w *outputWatch) index(from int, match func(string) bool) (int, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := from; i < len(w.lines); i++ {
		if match(w.lines[i]) {
			return i, w.times[i]
		}
	}
	return -1, time.Time{}
}

// wait waits for the next line matching match (after the previous
// wait's) and returns when it appeared.
func (w *outputWatch) wait(t *testing.T, what string, within time.Duration, match func(string) bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if i, at := w.index(w.next, match); i >= 0 {
			w.next = i + 1
			return at
		}
		if time.Now().After(deadline) {
			w.mu.Lock()
			last := strings.Join(w.lines[max(0, len(w.lines)-30):], "\n")
			w.mu.Unlock()
			t.Fatalf("waiting %s for: %s; the job's output ends:\n%s", within, what, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// seen returns when the first line matching match appeared, or zero.
func (w *outputWatch) seen(match func(string) bool) time.Time {
	_, at := w.index(0, match)
	return at
}

// line returns the first line matching match, or "".
func (w *outputWatch) line(match func(string) bool) string {
	i, _ := w.index(0, match)
	if i < 0 {
		return ""
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lines[i]
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(data)
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}
