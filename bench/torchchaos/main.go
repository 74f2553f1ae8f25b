// Command torchchaos is bench/pytorch-chaos.sh's engine (issue 33's goals): it trains
// examples/pytorch/snapshots.py as a DDP job of 3 nodes x 2 workers (CPU, gloo) on this machine
// three ways — torchrun with a torch.save checkpoint every N steps, gorun with the same
// checkpoint and its snapshots off, gorun with snapshots every step — kills a worker or a whole
// node every period, and prints per way the steps redone per failure, the seconds from a failure
// to the first step after it, the snapshot cost per step and the effective training time, and
// whether each final model is bit-identical to a fault-free run's.
//
//	go run ./bench/torchchaos -gorun /tmp/gorun -model-mb 100 -steps 60 -period 20s
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gorun/gorun/bench/benchproc"
)

// markerEnv is set in the environment of every process the bench starts: at the end, what is
// left of them is found by it and killed.
const markerEnv = "TORCHCHAOS_BENCH_MARKER"

// bench is one invocation: its settings and its rendezvous endpoints.
type bench struct {
	gorun, python, script string
	dir                   string
	modelMB               float64
	steps, ckptEvery      int
	nproc                 int // workers per node
	replicas              int
	period                time.Duration
	maxFaults             int // failures injected per way at most
	timeout               time.Duration
	seed                  uint64
	smoke                 bool
	costRuns              int // fault-free cost runs (measureCost) that measure the snapshot cost
	marker                string
	// snapshotFlags: the gorun binary has --snapshots and --snapshot-replicas.
	snapshotFlags bool
	etcd, c10d    string
	log           io.Writer
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "%s torchchaos: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "torchchaos:", err)
		os.Exit(1)
	}
}

// ways are the three ways of the issue, and the snapshot way with warm workers, in the
// order they run and print.
var ways = []way{
	{Name: "torchrun+ckpt", Torchrun: true, Ckpt: true},
	{Name: "gorun+ckpt", Ckpt: true},
	{Name: "gorun+snapshots", Snapshots: true},
	{Name: "gorun+warm", Snapshots: true, Warm: true},
}

// wayNames is every way's name, comma-separated, in order.
func wayNames() string {
	names := make([]string, len(ways))
	for i, w := range ways {
		names[i] = w.Name
	}
	return strings.Join(names, ",")
}

func run() error {
	b := &bench{log: os.Stderr}
	flag.StringVar(&b.gorun, "gorun", "", "the gorun binary (required)")
	flag.StringVar(&b.python, "python", "/usr/bin/python3", "the Python that has torch (its torchrun: python -m torch.distributed.run)")
	flag.StringVar(&b.script, "script", "examples/pytorch/snapshots.py", "the training script")
	flag.Float64Var(&b.modelMB, "model-mb", 100, "the model's size in MB of float32 parameters (100: 26M parameters)")
	flag.IntVar(&b.nproc, "nproc", 2, "workers per node")
	flag.IntVar(&b.steps, "steps", 60, "steps each run trains")
	flag.IntVar(&b.ckptEvery, "ckpt-every", 10, "the checkpoint ways' torch.save every this many steps")
	flag.IntVar(&b.replicas, "snapshot-replicas", 1, "gorun --snapshot-replicas of the snapshot way")
	flag.DurationVar(&b.period, "period", 20*time.Second, "one failure every period of training on average: each a time drawn uniformly from half a period to one and a half (seeded, the same for every way) after the first step or after the job recovered from the one before")
	flag.IntVar(&b.maxFaults, "max-faults", 8, "failures injected per way at most: then the way trains to its end undisturbed (the checkpoint ways, whose recoveries redo up to -ckpt-every steps, could otherwise trade a period's progress for each failure and never end)")
	flag.DurationVar(&b.timeout, "timeout", 15*time.Minute, "a run not done this long after its start fails the bench")
	flag.Uint64Var(&b.seed, "seed", 1, "seed of the failure draws")
	wayList := flag.String("ways", wayNames(), "the ways to run, comma-separated")
	jsonOut := flag.Bool("json", false, "also print one JSON object per way")
	flag.IntVar(&b.costRuns, "cost-runs", 0, "also measure the snapshot cost per step with this many fault-free runs whose script saves in every other block of 4 steps only: the steps with a snapshot against those without, in the same run; each run's figure printed and their median")
	flag.BoolVar(&b.smoke, "smoke", false, "smoke mode: one failure of each kind per way, each as soon as the job recovered; exit 1 unless every failure was recovered from and every final model is bit-identical")
	dir := flag.String("dir", "", "working directory (default: a fresh one under $TMPDIR, removed at the end)")
	flag.Parse()
	if b.gorun == "" {
		return errors.New("-gorun is required: the gorun binary to run")
	}
	if b.nproc < 1 {
		return fmt.Errorf("-nproc %d: want 1 or more workers per node", b.nproc)
	}
	if b.steps < 4 || b.ckptEvery < 1 || b.period <= 0 || b.modelMB <= 0 || b.replicas < 0 || b.costRuns < 0 || b.maxFaults < 1 {
		return fmt.Errorf("-steps %d (want 4 or more), -ckpt-every %d (want 1 or more), -period %v, -model-mb %v (want > 0), -snapshot-replicas %d, -cost-runs %d (want >= 0), -max-faults %d (want 1 or more)",
			b.steps, b.ckptEvery, b.period, b.modelMB, b.replicas, b.costRuns, b.maxFaults)
	}
	var chosen []way
	for _, name := range strings.Split(*wayList, ",") {
		i := indexWay(strings.TrimSpace(name))
		if i < 0 {
			return fmt.Errorf("-ways %q: no way %q (the ways: %s)", *wayList, name, wayNames())
		}
		chosen = append(chosen, ways[i])
	}
	var err error
	if b.script, err = filepath.Abs(b.script); err != nil {
		return err
	}
	if *dir == "" {
		if b.dir, err = os.MkdirTemp("", "gorun-torchchaos-"); err != nil {
			return err
		}
		defer os.RemoveAll(b.dir)
	} else if b.dir, err = filepath.Abs(*dir); err != nil {
		return err
	}
	for _, d := range []string{"logs", "tmp"} {
		if err := os.MkdirAll(filepath.Join(b.dir, d), 0o755); err != nil {
			return err
		}
	}
	var mk [8]byte
	_, _ = rand.Read(mk[:])
	b.marker = hex.EncodeToString(mk[:])
	help, _ := exec.Command(b.gorun, "--help").CombinedOutput()
	b.snapshotFlags = strings.Contains(string(help), "--snapshot-replicas")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	defer func() {
		if n := benchproc.KillMarked(markerEnv + "=" + b.marker); n > 0 {
			b.logf("killed %d processes left behind", n)
		}
	}()
	etcd, err := startEtcd(ctx, b)
	if etcd != nil {
		defer func() {
			_ = etcd.Process.Signal(syscall.SIGTERM)
			_ = etcd.Wait()
		}()
	}
	if err != nil {
		return err
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	b.c10d = fmt.Sprintf("127.0.0.1:%d", ports[0])
	b.logf("etcd at %s, c10d at %s; work in %s; %s", b.etcd, b.c10d, b.dir, map[bool]string{
		true: "gorun has --snapshots", false: "gorun has no --snapshots flag: the snapshot way cannot run"}[b.snapshotFlags])

	ref, err := newJob(b, way{Name: "fault-free"}, "fault-free", false)
	if err != nil {
		return err
	}
	b.logf("fault-free: gorun, no checkpoint, no snapshot (%s)", onOff(b.snapshotFlags, "--snapshots=false", "this gorun has no snapshots"))
	if err := ref.run(ctx); err != nil {
		return err
	}
	refSum := summarize(ref.events)
	var results []result
	for _, w := range chosen {
		if w.Snapshots && !b.snapshotFlags {
			b.logf("%s: skipped: %s has no --snapshots/--snapshot-replicas flags", w.Name, b.gorun)
			continue
		}
		j, err := newJob(b, w, w.Name, true)
		if err != nil {
			return err
		}
		b.logf("%s: starting %d nodes x %d workers, run id %s", w.Name, nodes, b.nproc, j.runID)
		if err := j.run(ctx); err != nil {
			return err
		}
		same, err := bitIdentical(ctx, b, j.out, ref.out)
		if err != nil {
			return err
		}
		results = append(results, result{way: w, costs: costs(j.fault, j.events), sum: summarize(j.events), identical: same})
	}
	var costRuns []blockCost
	if b.costRuns > 0 && b.snapshotFlags {
		if costRuns, err = measureCost(ctx, b); err != nil {
			return err
		}
	}
	var bw *bandwidth
	if b.snapshotFlags {
		if bw, err = snapshotBandwidth(ctx, b); err != nil {
			b.logf("snapshot bandwidth not measured: %v", err)
		}
	}
	printTable(os.Stdout, b, refSum, results, bw)
	printCost(os.Stdout, costRuns)
	if *jsonOut {
		for _, r := range results {
			line, err := json.Marshal(r.jsonOf(b, refSum, bw))
			if err != nil {
				return err
			}
			fmt.Println(string(line))
		}
		if len(costRuns) > 0 {
			line, err := json.Marshal(costJSON(costRuns))
			if err != nil {
				return err
			}
			fmt.Println(string(line))
		}
	}
	if b.smoke {
		return smokeCheck(results)
	}
	return nil
}

func indexWay(name string) int {
	for i, w := range ways {
		if w.Name == name {
			return i
		}
	}
	return -1
}

func onOff(c bool, yes, no string) string {
	if c {
		return yes
	}
	return no
}

// freePorts returns n distinct free TCP ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startEtcd starts a one-member etcd (`gorun rendezvous serve`) for the gorun ways; it is no
// node of the job, so a node's loss leaves it up. It returns once the member takes connections.
func startEtcd(ctx context.Context, b *bench) (*exec.Cmd, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	b.etcd = fmt.Sprintf("127.0.0.1:%d", ports[0])
	log, err := os.Create(filepath.Join(b.dir, "logs", "etcd.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(b.gorun, "rendezvous", "serve", "--name", "e0", "--listen", b.etcd,
		"--peer-listen", fmt.Sprintf("127.0.0.1:%d", ports[1]), "--data-dir", filepath.Join(b.dir, "etcd"))
	cmd.Env = append(os.Environ(), markerEnv+"="+b.marker)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("gorun rendezvous serve: %w", err)
	}
	go func() { _ = cmd.Wait(); log.Close() }()
	for deadline := time.Now().Add(60 * time.Second); ; {
		c, err := net.DialTimeout("tcp", b.etcd, time.Second)
		if err == nil {
			c.Close()
			return cmd, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return cmd, fmt.Errorf("etcd at %s: no connection within 60 s (log: %s): %w", b.etcd, filepath.Join(b.dir, "logs", "etcd.log"), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// compareScript prints "yes" when two torch.save'd state dicts hold the same keys and
// bit-identical tensors, else "no" and the first key that differs.
const compareScript = `import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
bad = [k for k in a if k not in b or a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8))]
bad += [k for k in b if k not in a]
print("yes" if not bad else "no " + bad[0])`

// bitIdentical compares two final models bit for bit.
func bitIdentical(ctx context.Context, b *bench, x, y string) (bool, error) {
	out, err := exec.CommandContext(ctx, b.python, "-c", compareScript, x, y).Output()
	if err != nil {
		return false, fmt.Errorf("comparing %s with %s: %w", x, y, err)
	}
	s := strings.TrimSpace(string(out))
	if s != "yes" {
		b.logf("%s differs from %s: %s", x, y, s)
	}
	return s == "yes", nil
}

// bandwidth is python/bench_snapshots.py's figures for the model's size on this machine.
type bandwidth struct {
	Bytes        int64   `json:"bytes"`
	MemcpyGBps   float64 `json:"memcpy_GBps"`
	SaveGBps     float64 `json:"save_complete_GBps"`
	RestoreGBps  float64 `json:"restore_verified_GBps"` // as a restarted worker under gorun restores: the agent checked the CRC
	SaveReturnGB float64 `json:"save_returns_GBps"`
}

// snapshotBandwidth runs python/bench_snapshots.py at the model's size: a snapshot's save (until
// complete) and restore (with GORUN_SNAPSHOT_VERIFIED=1, as gorun's workers restore) in GB/s beside
// a memcpy (Tensor.copy_) of the same bytes.
func snapshotBandwidth(ctx context.Context, b *bench) (*bandwidth, error) {
	script := filepath.Join(filepath.Dir(b.script), "..", "..", "python", "bench_snapshots.py")
	mb := max(1, int(b.modelMB+0.5))
	out, err := exec.CommandContext(ctx, b.python, script, "--mb", fmt.Sprint(mb), "--reps", "3").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --mb %d: %w", script, mb, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var bw bandwidth
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &bw); err != nil {
		return nil, fmt.Errorf("%s: its last line is not its JSON: %w", script, err)
	}
	return &bw, nil
}
