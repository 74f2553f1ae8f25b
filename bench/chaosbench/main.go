// Command chaosbench is bench/chaos.sh's engine (issue 21 item 5): it runs the embedded
// trainer as 4 agents x 2 workers plus one spare on this machine, over a three-member etcd of
// `gorun rendezvous serve`, injects one failure every period from a seeded mix, and prints,
// per failure kind, the downtime and the steps lost, and overall the effective training time
// next to a fault-free run of the same job.
//
//	go run ./bench/chaosbench -gorun /tmp/gorun -toml examples/train.toml -duration 3m -periods 60s,15s
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gorun/gorun/bench/benchproc"
)

// bench is one invocation: its settings and its etcd.
type bench struct {
	gorun, toml string
	sets        []string
	dir         string
	duration    time.Duration
	seed        uint64
	every       int
	marker      string
	// smoke: one chaos run that injects each fault kind once, each after the job recovered
	// from the one before, and fails unless every one was injected and recovered from.
	smoke bool
	etcd  *cluster
	log   io.Writer
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "%s chaos: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "chaosbench:", err)
		os.Exit(1)
	}
}

func run() error {
	gorun := flag.String("gorun", "", "the gorun binary")
	toml := flag.String("toml", "examples/train.toml", "the job's train.toml")
	duration := flag.Duration("duration", 5*time.Minute, "how long each run trains (after its first step of the whole world)")
	periods := flag.String("periods", "60s,15s", "a chaos run per period: one failure every period")
	seed := flag.Uint64("seed", 1, "seed of the failure mix")
	every := flag.Int("ckpt-every", 200, "checkpoint every this many steps")
	jsonOut := flag.Bool("json", false, "also print one JSON line per period")
	smoke := flag.Bool("smoke", false, "smoke mode: after the fault-free run, one chaos run that injects each fault kind once (each after the job recovered from the one before; -periods is ignored) and exits 1 unless every kind was injected and recovered from")
	straggle := flag.Bool("straggler", false, "after the chaos runs, the two straggler runs: one node slowed, without and with --evict-stragglers")
	dir := flag.String("dir", "", "working directory (default: a fresh one under $TMPDIR, removed at the end)")
	flag.Parse()
	if *gorun == "" {
		return fmt.Errorf("-gorun is required")
	}
	var ps []time.Duration
	for _, p := range strings.Split(*periods, ",") {
		if *smoke {
			ps = []time.Duration{time.Second} // a period only marks the run as a chaos run
			break
		}
		d, err := time.ParseDuration(strings.TrimSpace(p))
		if err != nil || d <= 0 {
			return fmt.Errorf("-periods %q: %q is not a positive duration", *periods, p)
		}
		ps = append(ps, d)
	}
	var mk [8]byte
	_, _ = rand.Read(mk[:])
	b := &bench{gorun: *gorun, duration: *duration, seed: *seed, every: *every, marker: hex.EncodeToString(mk[:]), smoke: *smoke, log: os.Stderr}
	var err error
	if b.toml, err = filepath.Abs(*toml); err != nil {
		return err
	}
	if *dir == "" {
		if b.dir, err = os.MkdirTemp("", "gorun-chaos-"); err != nil {
			return err
		}
		defer os.RemoveAll(b.dir)
	} else if b.dir, err = filepath.Abs(*dir); err != nil {
		return err
	}
	for _, d := range []string{"logs", "etcd", "tmp"} {
		if err := os.MkdirAll(filepath.Join(b.dir, d), 0o755); err != nil {
			return err
		}
	}
	// The job: a small model (a few ms a step), a global batch that 4, 6 and 8 workers divide
	// into micro batches of 2, and a constant learning rate after the warm-up, so that the
	// model at step k does not depend on train.steps: the runs go "forever" and are stopped.
	b.sets = []string{
		"--set", "model.layers=2", "--set", "model.d_model=32", "--set", "model.heads=2", "--set", "model.context=32",
		"--set", "train.global_batch=48", "--set", "train.micro_batch=2", "--set", "train.steps=1000000",
		"--set", "train.log_every=1000000", "--set", "optim.warmup=5", "--set", "optim.lr=3e-3", "--set", "optim.min_lr=3e-3",
		"--set", fmt.Sprintf("checkpoint.every=%d", b.every), "--set", "checkpoint.keep=1000000",
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	defer func() {
		if n := benchproc.KillMarked(markerEnv + "=" + b.marker); n > 0 {
			b.logf("killed %d processes left behind", n)
		}
	}()
	b.etcd, err = startCluster(ctx, b)
	if b.etcd != nil {
		defer b.etcd.stop()
	}
	if err != nil {
		return err
	}
	b.logf("etcd: 3 members at %s; work in %s", strings.Join(b.etcd.endpoints(), ","), b.dir)

	ref, err := runJob(ctx, b, "fault-free", 0)
	if err != nil {
		return err
	}
	refSum, err := analyze(ref)
	if err != nil {
		return err
	}
	var lines []string
	for _, p := range ps {
		name := fmt.Sprintf("T%s", p)
		if b.smoke {
			name = "smoke"
		}
		j, err := runJob(ctx, b, name, p)
		if err != nil {
			return err
		}
		s, err := analyze(j)
		if err != nil {
			return err
		}
		cmp := compareFinal(ctx, j.ckpt, ref.ckpt)
		printTable(os.Stdout, b, j, s, refSum, cmp)
		if b.smoke {
			if err := checkInjected(j.faults, s.Costs); err != nil {
				return fmt.Errorf("smoke: %w (logs in %s: run with KEEP=dir to keep them)", err, filepath.Join(b.dir, "logs"))
			}
			fmt.Printf("\nsmoke: every fault kind (%d) injected and recovered from\n", len(kinds))
		}
		line, err := jsonLine(b, j, s, refSum, cmp)
		if err != nil {
			return err
		}
		lines = append(lines, line)
	}
	if *straggle {
		var sums [2]summary
		var jobs [2]*job
		for i, evict := range []bool{false, true} {
			name := "slowed"
			if evict {
				name = "slowed-evict"
			}
			j, err := newJob(b, name, 0)
			if err != nil {
				return err
			}
			j.straggle, j.evict = true, evict
			if err := runGiven(ctx, b, j); err != nil {
				return err
			}
			if sums[i], err = analyze(j); err != nil {
				return err
			}
			jobs[i] = j
		}
		printStragglerTable(os.Stdout, b, refSum, sums[0], sums[1], jobs[0], jobs[1])
		if jobs[0].slow.evicted.Host != "" {
			return fmt.Errorf("the slowed run without eviction evicted %s: %s", jobs[0].slow.evicted.Host, jobs[0].slow.evicted.Error)
		}
		if jobs[1].slow.evicted.Host != jobs[1].slow.node {
			return fmt.Errorf("the slowed run with --evict-stragglers=%v did not evict the slowed node %s (evicted: %q); logs in %s",
				evictAfter, jobs[1].slow.node, jobs[1].slow.evicted.Host, filepath.Join(b.dir, "logs"))
		}
		lines = append(lines, stragglerJSON(sums[0], sums[1], refSum, jobs[1]))
	}
	if *jsonOut {
		for _, l := range lines {
			fmt.Println(l)
		}
	}
	return nil
}

// runJob runs one job (fault-free when period is 0) and leaves no process of it behind.
func runJob(ctx context.Context, b *bench, name string, period time.Duration) (*job, error) {
	j, err := newJob(b, name, period)
	if err != nil {
		return nil, err
	}
	return j, runGiven(ctx, b, j)
}

// runGiven runs job j and leaves no process of it behind.
func runGiven(ctx context.Context, b *bench, j *job) error {
	b.logf("%s: starting %d agents (%d nodes x 2 workers, 1 spare), run id %s", j.name, slots, nodes, j.runID)
	err := j.run(ctx)
	for _, a := range j.agents {
		if a != nil && a.alive() {
			benchproc.SignalTree(a.cmd.Process.Pid, syscall.SIGKILL)
			<-a.done
		}
	}
	return err
}

// printTable prints one chaos run's table.
func printTable(w io.Writer, b *bench, j *job, s, ref summary, cmp comparison) {
	injected := 0
	for _, f := range j.faults {
		if f.Skipped == "" {
			injected++
		}
	}
	if b.smoke {
		fmt.Fprintf(w, "\n## smoke: each kind of failure once, each after the job recovered from the one before, seed %d: %d failures (%d drawn)\n\n", b.seed, injected, len(j.faults))
	} else {
		fmt.Fprintf(w, "\n## one failure every %v, %v of training, seed %d: %d failures (%d drawn)\n\n", j.period, b.duration, b.seed, injected, len(j.faults))
	}
	fmt.Fprintln(w, "| failure | n | downtime median | downtime max | steps lost | most lost by one |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, r := range byKind(s.Costs) {
		note := ""
		if r.Overlapped > 0 {
			note += fmt.Sprintf(" (%d during the previous recovery)", r.Overlapped)
		}
		if r.Unrecovered > 0 {
			note += fmt.Sprintf(" (%d not recovered by the end)", r.Unrecovered)
		}
		fmt.Fprintf(w, "| %s%s | %d | %.2f s | %.2f s | %d | %d |\n", r.Kind, note, r.N, r.DowntimeMed, r.DowntimeMax, r.StepsLost, r.LostMax)
	}
	fmt.Fprintf(w, "\neffective training time (time on kept steps / wall time): %.3f; fault-free run: %.3f\n", s.Effective(), ref.Effective())
	fmt.Fprintf(w, "steps kept: %d in %.0f s (%.1f/s); fault-free: %d in %.0f s (%.1f/s): goodput %.3f of the fault-free run's\n",
		s.Kept, s.Window.Seconds(), s.Rate(), ref.Kept, ref.Window.Seconds(), ref.Rate(), s.Rate()/ref.Rate())
	fmt.Fprintf(w, "steps redone: %d (records %d); median step %.1f ms (fault-free %.1f ms); checkpoint every %d steps\n",
		s.Records-s.Kept, s.Records, ms(s.StepTime), ms(ref.StepTime), b.every)
	if len(s.Joins) > 0 {
		fmt.Fprintf(w, "nodes taken in (spares, replacements): %d, the running world paused %.2f s median, %.2f s max\n",
			len(s.Joins), medianDuration(s.Joins).Seconds(), slices.Max(s.Joins).Seconds())
	}
	fmt.Fprintf(w, "final model: %s\n", cmp)
	for _, c := range s.Costs {
		state := fmt.Sprintf("downtime %.2f s, %d steps lost", c.Downtime.Seconds(), c.Lost)
		if c.Unrecovered {
			state = "not recovered by the end"
		}
		fmt.Fprintf(w, "  %s %s: %s: %s\n", c.At.Format("15:04:05.000"), c.Kind, c.Victim, state)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// jsonLine is one period's figures as one JSON object.
func jsonLine(b *bench, j *job, s, ref summary, cmp comparison) (string, error) {
	injected := 0
	for _, f := range j.faults {
		if f.Skipped == "" {
			injected++
		}
	}
	v := struct {
		PeriodS            float64   `json:"period_s"`
		DurationS          float64   `json:"duration_s"`
		Seed               uint64    `json:"seed"`
		Failures           int       `json:"failures"`
		Effective          float64   `json:"effective_training_time"`
		FaultFreeEffective float64   `json:"fault_free_effective_training_time"`
		Goodput            float64   `json:"goodput_vs_fault_free"`
		StepsKept          int       `json:"steps_kept"`
		StepsRedone        int       `json:"steps_redone"`
		StepMS             float64   `json:"step_ms_median"`
		FaultFreeStepMS    float64   `json:"fault_free_step_ms_median"`
		CheckpointEvery    int       `json:"checkpoint_every"`
		ByKind             []kindRow `json:"by_kind"`
		Joins              int       `json:"joins"`
		JoinPauseMedS      float64   `json:"join_pause_median_s"`
		JoinPauseMaxS      float64   `json:"join_pause_max_s"`
		CompareStep        int64     `json:"compare_step"`
		AllClose           bool      `json:"allclose"`
		MaxAbsDiff         float64   `json:"max_abs_diff"`
		CompareError       string    `json:"compare_error,omitempty"`
	}{
		PeriodS: j.period.Seconds(), DurationS: b.duration.Seconds(), Seed: b.seed, Failures: injected,
		Effective: round3(s.Effective()), FaultFreeEffective: round3(ref.Effective()), Goodput: round3(s.Rate() / ref.Rate()),
		StepsKept: s.Kept, StepsRedone: s.Records - s.Kept, StepMS: round3(ms(s.StepTime)), FaultFreeStepMS: round3(ms(ref.StepTime)),
		CheckpointEvery: b.every, ByKind: byKind(s.Costs), Joins: len(s.Joins), CompareStep: cmp.Step, AllClose: cmp.AllClose, MaxAbsDiff: cmp.MaxAbs, CompareError: cmp.Err,
	}
	if len(s.Joins) > 0 {
		v.JoinPauseMedS, v.JoinPauseMaxS = round3(medianDuration(s.Joins).Seconds()), round3(slices.Max(s.Joins).Seconds())
	}
	out, err := json.Marshal(v)
	return string(out), err
}

func round3(x float64) float64 { return float64(int64(x*1000+0.5)) / 1000 }

// stragglerJSON is the straggler runs' figures as one JSON object.
func stragglerJSON(off, on, ref summary, onJob *job) string {
	v := struct {
		Straggler        bool    `json:"straggler"`
		EvictAfterS      float64 `json:"evict_after_s"`
		FaultFreeRate    float64 `json:"fault_free_steps_per_s"`
		SlowedRate       float64 `json:"slowed_steps_per_s"`
		EvictRate        float64 `json:"slowed_evict_steps_per_s"`
		Gained           float64 `json:"eviction_gained"`
		EvictedAfterSlow float64 `json:"evicted_s_after_slowdown"`
	}{true, evictAfter.Seconds(), round3(ref.Rate()), round3(off.Rate()), round3(on.Rate()), round3(on.Rate() / off.Rate()),
		round3(onJob.slow.evicted.Time.Sub(onJob.slow.at).Seconds())}
	out, _ := json.Marshal(v)
	return string(out)
}
