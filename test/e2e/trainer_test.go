package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/test/harness"
	"github.com/gorun/gorun/trainer/metrics"
)

// trainerSets make the embedded trainer's model tiny, so that 20 steps take
// well under a second of CPU at any world size that divides the batch.
var trainerSets = []string{
	"--set", "model.layers=1", "--set", "model.d_model=16", "--set", "model.heads=2", "--set", "model.context=16",
	"--set", "train.global_batch=8", "--set", "train.micro_batch=2", "--set", "train.steps=20",
	"--set", "train.log_every=5", "--set", "optim.warmup=5",
}

// trainerToml writes a small text corpus and a train.toml that reads it
// into a fresh directory, and returns the toml's path.
func trainerToml(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	var corpus strings.Builder
	for i := range 200 {
		fmt.Fprintf(&corpus, "line %d: the quick brown fox jumps over the lazy dog; func f%d() int { return %d }\n", i, i, i*i)
	}
	if err := os.WriteFile(filepath.Join(dir, "corpus.txt"), []byte(corpus.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	toml := filepath.Join(dir, "train.toml")
	if err := os.WriteFile(toml, []byte("[data]\nfiles = [\"corpus.txt\"]\n\n[train]\nmetrics = \"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return toml
}

// readMetrics is the job's final line of steps in the metrics file at path (harness.Records);
// it fails t when the file is missing or a line is not a record.
func readMetrics(t *testing.T, path string) []metrics.Record {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("metrics: %v", err)
	}
	recs, err := harness.Records(path)
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	return recs
}

// TestTrainerLayoutsMatch is the invariant of docs/design.md, on real processes
// started by real agents, to the bit: the same config as one process, as
// ddp 4x1, fsdp 1x4 and hsdp 2x2 (two agents of two workers) has the same
// loss at every step (the same float64) and ends with the same checkpoint
// (gorun ckpt diff --rtol 0: parameters and AdamW moments), and replicas end
// bit-identical. One step of 8 sequences instead of 4 micro steps of 2 is
// other units of summation (a unit's gradient is a float32 sum over its
// sequences), so it only follows one process, to 1e-6 relative.
func TestTrainerLayoutsMatch(t *testing.T) {
	toml := trainerToml(t)
	out := t.TempDir()
	type layout struct {
		name     string
		nodes    int
		args     []string // after the launch flags
		replicas [][]int  // groups of ranks that must end bit-identical
		bits     bool     // one process's bits: every loss and the final checkpoint
	}
	layouts := []layout{
		{"single", 1, []string{"--set", "parallel.mode=ddp"}, nil, true},
		{"accumulation", 1, []string{"--set", "train.micro_batch=8"}, nil, false},
		{"ddp-4x1", 1, []string{"--set", "parallel.mode=ddp"}, [][]int{{0, 1, 2, 3}}, true},
		{"fsdp-1x4", 1, []string{"--set", "parallel.mode=fsdp"}, nil, true},
		{"hsdp-2x2", 2, []string{"--set", "parallel.mode=hsdp"}, [][]int{{0, 2}, {1, 3}}, true},
	}
	losses := map[string][]float64{}
	ckpt := func(l layout) string { return filepath.Join(out, l.name+"-ckpt") }
	for _, l := range layouts {
		nproc := 4
		if l.name == "single" || l.name == "accumulation" {
			nproc = 1
		}
		metricsPath := filepath.Join(out, l.name+".jsonl")
		dump := filepath.Join(out, l.name)
		worker := append(append(append([]string{toml}, trainerSets...), l.args...), "--metrics", metricsPath, "--dump-params", dump,
			"--set", fmt.Sprintf("checkpoint.dir=%q", ckpt(l))) // each layout starts afresh
		var results []result
		if l.nodes == 1 {
			results = []result{runGorun(t, nil, append([]string{fmt.Sprintf("--nproc-per-node=%d", nproc)}, worker...)...)}
		} else {
			port := testutil.FreePort(t)
			results = waitAll(startAgents(t, nodeNames(l.nodes), nil, func(node int) []string {
				return append([]string{fmt.Sprintf("--nnodes=%d", l.nodes), fmt.Sprintf("--node-rank=%d", node),
					"--master-addr=127.0.0.1", fmt.Sprintf("--master-port=%d", port),
					fmt.Sprintf("--nproc-per-node=%d", nproc/l.nodes)}, worker...)
			}))
		}
		for node, r := range results {
			if r.ExitCode != 0 {
				t.Fatalf("%s: node %d: exit %d, want 0", l.name, node, r.ExitCode)
			}
		}
		recs := readMetrics(t, metricsPath)
		if len(recs) != 20 {
			t.Fatalf("%s: %d metrics records, want 20", l.name, len(recs))
		}
		for i, r := range recs {
			if r.Step != i+1 || r.WorldSize != nproc || r.TokensPerS <= 0 {
				t.Fatalf("%s: record %d is %+v, want step %d of world size %d", l.name, i, r, i+1, nproc)
			}
			losses[l.name] = append(losses[l.name], r.Loss)
		}
		if step := newestStep(t, ckpt(l)); step != 20 {
			t.Fatalf("%s: newest checkpoint is of step %d, want the end of the run's, 20", l.name, step)
		}
		for _, group := range l.replicas {
			first, err := os.ReadFile(filepath.Join(dump, fmt.Sprintf("rank-%d.bin", group[0])))
			if err != nil {
				t.Fatal(err)
			}
			for _, rank := range group[1:] {
				other, err := os.ReadFile(filepath.Join(dump, fmt.Sprintf("rank-%d.bin", rank)))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(first, other) {
					t.Errorf("%s: replicas %d and %d ended with different parameters", l.name, group[0], rank)
				}
			}
		}
	}
	single := losses["single"]
	if !(single[19] < single[0]) {
		t.Errorf("single: loss went from %.4f to %.4f, want it to fall", single[0], single[19])
	}
	for _, l := range layouts[1:] {
		var worst float64
		differ := 0
		for i, loss := range losses[l.name] {
			worst = max(worst, math.Abs(loss-single[i])/math.Abs(single[i]))
			if math.Float64bits(loss) != math.Float64bits(single[i]) {
				differ++
			}
		}
		t.Logf("%-12s against one process over 20 steps: %d losses differ, by %.2e relative at most", l.name, differ, worst)
		switch {
		case l.bits && differ > 0:
			t.Errorf("%s: %d of 20 losses differ from one process (by %.2e relative at most), want the same bits\n got %v\nwant %v", l.name, differ, worst, losses[l.name], single)
		case !l.bits && worst > 1e-6:
			t.Errorf("%s: losses differ from one process by %.2e relative, want <= 1e-6\n got %v\nwant %v", l.name, worst, losses[l.name], single)
		}
		if l.bits {
			requireEqual(t, ckpt(l), ckpt(layouts[0]))
		}
	}
}

// TestTrainerActivationCheckpointing: a run of a three-block model with
// [train] activation_checkpointing = true, as fsdp on two workers, has the
// loss of the run without it at every step (the same float64) and ends with
// its checkpoint (gorun ckpt diff --rtol 0).
func TestTrainerActivationCheckpointing(t *testing.T) {
	toml := trainerToml(t)
	out := t.TempDir()
	for _, on := range []string{"false", "true"} {
		args := append(append([]string{"--nproc-per-node=2", toml}, trainerSets...),
			"--set", "model.layers=3", // the last block is never recomputed: two or more to recompute any
			"--set", "parallel.mode=fsdp", "--set", "train.activation_checkpointing="+on,
			"--metrics", filepath.Join(out, on+".jsonl"), "--set", fmt.Sprintf("checkpoint.dir=%q", filepath.Join(out, on+"-ckpt")))
		if r := runGorun(t, nil, args...); r.ExitCode != 0 {
			t.Fatalf("activation_checkpointing=%s: exit %d, want 0\n%s", on, r.ExitCode, r.Stderr)
		}
		if step := newestStep(t, filepath.Join(out, on+"-ckpt")); step != 20 {
			t.Fatalf("activation_checkpointing=%s: newest checkpoint is of step %d, want 20", on, step)
		}
	}
	off, on := readMetrics(t, filepath.Join(out, "false.jsonl")), readMetrics(t, filepath.Join(out, "true.jsonl"))
	if len(off) != 20 || len(on) != 20 {
		t.Fatalf("%d and %d metrics records, want 20 each", len(off), len(on))
	}
	for i := range off {
		if on[i].Step != i+1 || math.Float64bits(on[i].Loss) != math.Float64bits(off[i].Loss) {
			t.Fatalf("step %d: loss %v with activation checkpointing, %v without; want the same bits", off[i].Step, on[i].Loss, off[i].Loss)
		}
	}
	if !(on[19].Loss < on[0].Loss) {
		t.Errorf("loss went from %.4f to %.4f, want it to fall", on[0].Loss, on[19].Loss)
	}
	requireEqual(t, filepath.Join(out, "true-ckpt"), filepath.Join(out, "false-ckpt"))
}

// workerEnv edits the environment of a worker started without gorun.
func workerEnv(kv ...string) []string {
	unset := []string{"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
		"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE"}
	return append(unset, kv...)
}

// TestTrainerBadInput: a bad train.toml is one line naming file:line and
// exit 2, as is a worker started outside gorun; WORLD_SIZE=1 alone trains.
func TestTrainerBadInput(t *testing.T) {
	toml := trainerToml(t)
	bad := filepath.Join(filepath.Dir(toml), "bad.toml")
	if err := os.WriteFile(bad, []byte("[data]\nfiles = [\"corpus.txt\"]\n\n[train]\nsteps = -5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		env  []string
		args []string
		code int
		want string // in stderr; stderr must be one line unless code is 0
	}{
		{"bad config", workerEnv("WORLD_SIZE=1"), []string{"worker", bad}, 2, "bad.toml:5: train.steps = -5: must be at least 1"},
		{"bad --set", workerEnv("WORLD_SIZE=1"), []string{"worker", toml, "--set", "train.steps=x"}, 2, "--set train.steps=x"},
		{"unknown flag", workerEnv("WORLD_SIZE=1"), []string{"worker", toml, "--bogus"}, 2, "unknown flag --bogus"},
		{"outside gorun", workerEnv(), []string{"worker", toml}, 2, "not started by gorun or torchrun"},
		{"alone", workerEnv("WORLD_SIZE=1"), append([]string{"worker", toml}, trainerSets...), 0, ""},
		{"bad config under gorun", nil, []string{"--nproc-per-node=1", bad}, 2, "bad.toml:5: train.steps = -5"},
	}
	check := func(t *testing.T, r result, code int, want string, oneLine bool) {
		t.Helper()
		if r.ExitCode != code {
			t.Fatalf("exit %d, want %d", r.ExitCode, code)
		}
		if code == 0 {
			if !strings.Contains(r.Stdout, "step 20/20 loss") {
				t.Errorf("stdout has no last progress line:\n%s", r.Stdout)
			}
			return
		}
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, r.Stderr)
		}
		if oneLine && len(nonEmptyLines(r.Stderr)) != 1 {
			t.Errorf("stderr is not one line:\n%s", r.Stderr)
		}
	}
	lean := filepath.Join(filepath.Dir(gorunBin), "gorun-worker")
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			worker := tc.args[0] == "worker"
			check(t, startProc(t, tc.name, gorunBin, tc.env, tc.args...).wait(), tc.code, tc.want, worker)
			if !worker {
				return
			}
			// gorun-worker reads the same command line, less the word "worker"
			// (and its own checkpoints: it must not resume from the first run's).
			if _, err := os.Stat(lean); err != nil {
				t.Skipf("no gorun-worker beside %s (GORUN_BIN without it)", gorunBin)
			}
			args := append(slices.Clone(tc.args[1:]), "--set", fmt.Sprintf("checkpoint.dir=%q", t.TempDir()))
			check(t, startProc(t, tc.name, lean, tc.env, args...).wait(), tc.code, tc.want, true)
		})
	}
}

// TestLeanWorker: gorun runs a train.toml's workers with the gorun-worker
// beside it, and a gorun binary alone in its directory runs them itself
// (`gorun worker`), trains all the same, and says why at the launch.
func TestLeanWorker(t *testing.T) {
	toml := trainerToml(t)
	lean := filepath.Join(filepath.Dir(gorunBin), "gorun-worker")
	if _, err := os.Stat(lean); err != nil {
		t.Skipf("no gorun-worker beside %s (GORUN_BIN without it)", gorunBin)
	}
	planCommand := func(t *testing.T, bin string) ([]string, []string) {
		t.Helper()
		r := startProc(t, "plan", bin, nil, "plan", "--nproc-per-node=2", toml).wait()
		var plan struct {
			Command []string `json:"command"`
			Notes   []string `json:"notes"`
		}
		if err := json.Unmarshal([]byte(r.Stdout), &plan); err != nil {
			t.Fatalf("gorun plan: exit %d, not JSON (%v):\n%s%s", r.ExitCode, err, r.Stdout, r.Stderr)
		}
		return plan.Command, plan.Notes
	}
	t.Run("beside gorun", func(t *testing.T) {
		command, notes := planCommand(t, gorunBin)
		if len(command) != 2 || command[0] != lean || command[1] != toml {
			t.Errorf("command %q, want [%s %s]", command, lean, toml)
		}
		for _, n := range notes {
			if strings.Contains(n, "gorun-worker") {
				t.Errorf("note about gorun-worker while it is there: %s", n)
			}
		}
	})
	t.Run("gorun alone", func(t *testing.T) {
		alone := filepath.Join(t.TempDir(), "gorun")
		data, err := os.ReadFile(gorunBin)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(alone, data, 0o755); err != nil {
			t.Fatal(err)
		}
		command, notes := planCommand(t, alone)
		if len(command) != 3 || command[0] != alone || command[1] != "worker" {
			t.Errorf("command %q, want [%s worker %s]", command, alone, toml)
		}
		if !strings.Contains(strings.Join(notes, "\n"), "not gorun-worker: there is none in") {
			t.Errorf("no note says why the workers run gorun worker: %q", notes)
		}
		r := startProc(t, "gorun alone", alone, nil, append([]string{"--standalone", "--nproc-per-node=2", toml}, trainerSets...)...).wait()
		if r.ExitCode != 0 {
			t.Fatalf("exit %d:\n%s", r.ExitCode, harness.Tail(r.Stderr, 20))
		}
		if !strings.Contains(r.Stdout, "step 20/20 loss") || !strings.Contains(r.Stderr, "not gorun-worker: there is none in") {
			t.Errorf("want the last progress line and the note:\n%s\n%s", harness.Tail(r.Stdout, 5), harness.Tail(r.Stderr, 20))
		}
	})
}

// TestTrainerStops: SIGTERM stops a worker at once with 128+15; when a
// peer is killed, the survivor exits non-zero at once naming its rank.
func TestTrainerStops(t *testing.T) {
	toml := trainerToml(t)
	long := append(append([]string{"worker", toml}, trainerSets...), "--set", "train.steps=1000000", "--set", "train.log_every=1")
	started := func(stdout string) bool { return strings.Contains(stdout, "step 2/") }

	t.Run("sigterm", func(t *testing.T) {
		p := startProc(t, "worker", gorunBin, workerEnv("WORLD_SIZE=1"), append(long, "--set", fmt.Sprintf("checkpoint.dir=%q", t.TempDir()))...)
		if !p.waitOutput(30*time.Second, started) {
			t.Fatalf("no progress within 30s:\n%s", p.stdout.String())
		}
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		r := p.wait()
		if r.ExitCode != 128+int(syscall.SIGTERM) || !strings.Contains(r.Stderr, "stopped by terminated") {
			t.Errorf("exit %d, stderr %q: want %d and 'stopped by terminated'", r.ExitCode, r.Stderr, 128+int(syscall.SIGTERM))
		}
	})

	t.Run("peer killed", func(t *testing.T) {
		port := testutil.FreePort(t)
		procs := make([]*gorunProc, 2)
		ckpt := []string{"--set", fmt.Sprintf("checkpoint.dir=%q", t.TempDir())} // not the sigterm run's checkpoints
		for rank := range procs {
			env := workerEnv(fmt.Sprintf("RANK=%d", rank), fmt.Sprintf("LOCAL_RANK=%d", rank), "WORLD_SIZE=2",
				"LOCAL_WORLD_SIZE=2", "GROUP_RANK=0", "GROUP_WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1",
				fmt.Sprintf("MASTER_PORT=%d", port), "TORCHELASTIC_RUN_ID=peer-killed")
			procs[rank] = startProc(t, fmt.Sprintf("rank%d", rank), gorunBin, env, append(long, ckpt...)...)
		}
		if !procs[0].waitOutput(30*time.Second, started) {
			t.Fatalf("no progress within 30s:\n%s", procs[0].stdout.String())
		}
		if err := procs[1].cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		procs[1].wait()
		r := procs[0].wait()
		if r.ExitCode != 1 || !strings.Contains(r.Stderr, "rank 1") {
			t.Errorf("survivor: exit %d, stderr %q: want 1 and an error naming rank 1", r.ExitCode, r.Stderr)
		}
	})
}

// TestExampleLearns runs examples/train.toml as docs/design.md promises it
// learns: 300 steps on two workers over the built-in corpus, the loss
// from about ln 256 = 5.5 to below 3.0 (2.82 measured). It takes a few minutes of CPU, so it runs only with
// E2E_TRAINER_LEARN=1.
func TestExampleLearns(t *testing.T) {
	if os.Getenv("E2E_TRAINER_LEARN") != "1" {
		t.Skip("set E2E_TRAINER_LEARN=1 to train examples/train.toml (minutes of CPU)")
	}
	metricsPath := filepath.Join(t.TempDir(), "metrics.jsonl")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gorunBin, "--nproc-per-node=2", filepath.Join(moduleRoot, "examples", "train.toml"),
		"--metrics", metricsPath)
	cmd.Dir = t.TempDir()
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopGrace
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("wall time %v\n%s", time.Since(start).Round(time.Second), harness.Tail(stdout.String(), 40))
	if err != nil {
		t.Fatalf("gorun: %v\n%s", err, harness.Tail(stderr.String(), 20))
	}
	recs := readMetrics(t, metricsPath)
	if len(recs) != 300 {
		t.Fatalf("%d records, want 300", len(recs))
	}
	var last float64
	for _, r := range recs[290:] {
		last += r.Loss / 10
	}
	t.Logf("loss: step 1 %.3f, mean of steps 291-300 %.3f, after %.0f s of training", recs[0].Loss, last, recs[299].ElapsedS)
	if recs[0].Loss < 5.0 || last >= 3.0 {
		t.Errorf("loss went from %.3f to %.3f, want from about 5.5 to below 3.0", recs[0].Loss, last)
	}
}
