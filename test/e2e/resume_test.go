package e2e

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/test/harness"
	"github.com/gorun/gorun/trainer/metrics"
)

// resumeSets is a model a little larger than trainerSets' (a few ms a step), so that a run can be
// killed or signalled half way; 40 steps, a checkpoint every 5, a progress line every step.
var resumeSets = append(append([]string(nil), trainerSets...),
	"--set", "model.layers=2", "--set", "model.d_model=32", "--set", "model.context=32",
	"--set", "train.steps=40", "--set", "train.log_every=1", "--set", "checkpoint.every=5")

// resumeRun starts gorun on the embedded trainer with nproc workers, its checkpoints in dir and
// its metrics appended to metrics.
func resumeRun(t *testing.T, name, toml, dir, metrics string, nproc int, extra ...string) *gorunProc {
	t.Helper()
	args := append([]string{fmt.Sprintf("--nproc-per-node=%d", nproc), toml}, resumeSets...)
	args = append(append(args, "--set", fmt.Sprintf("checkpoint.dir=%q", dir), "--metrics", metrics), extra...)
	return startGorun(t, name, nil, args...)
}

// newestStep is the step of the newest complete checkpoint in dir (harness.NewestStep); it
// fails t when there is none.
func newestStep(t *testing.T, dir string) int64 {
	t.Helper()
	step, err := harness.NewestStep(dir)
	if err != nil {
		t.Fatal(err)
	}
	return step
}

// ckptDiff runs gorun ckpt diff --rtol=rtol a b.
func ckptDiff(t *testing.T, rtol string, a, b string) result {
	t.Helper()
	return startGorun(t, "ckpt diff", nil, "ckpt", "diff", "--rtol="+rtol, a, b).wait()
}

// requireEqual: the newest checkpoints of a and b are bit-identical per gorun ckpt diff --rtol 0.
func requireEqual(t *testing.T, a, b string) {
	t.Helper()
	r := ckptDiff(t, "0", a, b)
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, "equal: ") {
		t.Fatalf("gorun ckpt diff --rtol 0 %s %s: exit %d, want 0 and 'equal'\n%s%s", a, b, r.ExitCode, r.Stdout, r.Stderr)
	}
	t.Logf("ckpt diff --rtol 0: %s", strings.TrimSpace(lastLine(r.Stdout)))
}

func lastLine(s string) string {
	lines := nonEmptyLines(s)
	if len(lines) == 0 {
		return ""
	}
	return lines[len(lines)-1]
}

// requireSteps: the metrics file holds exactly the steps from..to, in order.
func requireSteps(t *testing.T, metrics string, from, to int) []metrics.Record {
	t.Helper()
	recs := readMetrics(t, metrics)
	if len(recs) != to-from+1 {
		t.Fatalf("%s: %d records, want steps %d..%d", metrics, len(recs), from, to)
	}
	for i, r := range recs {
		if r.Step != from+i {
			t.Fatalf("%s: record %d is step %d, want %d", metrics, i, r.Step, from+i)
		}
	}
	return recs
}

// normDiff is harness.NormDiff of the newest checkpoints of ref and got (||got-ref|| / ||ref||
// per group of tensors); it fails t when they cannot be compared.
func normDiff(t *testing.T, ref, got string) map[string]float64 {
	t.Helper()
	rel, err := harness.NormDiff(context.Background(), ref, got)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

// TestResume is issue 5's must-show on real gorun processes: 40 steps straight vs 20 steps,
// kill -9 of every worker, and a restart for the rest ends bit-identical at the same world size
// and within 1e-5 relative at another; a corrupt newest checkpoint is skipped for the one before,
// with the reason in the log; SIGUSR1 checkpoints and exits 75 (requeue) and the next start loses
// no step; SIGTERM checkpoints and exits 143.
func TestResume(t *testing.T) {
	toml := trainerToml(t)
	root := t.TempDir()
	straight := filepath.Join(root, "straight")
	if r := resumeRun(t, "straight", toml, straight, straight+".jsonl", 2).wait(); r.ExitCode != 0 {
		t.Fatalf("straight run: exit %d", r.ExitCode)
	}
	straightRecs := requireSteps(t, straight+".jsonl", 1, 40)

	t.Run("kill -9", func(t *testing.T) {
		killed := filepath.Join(root, "killed")
		p := resumeRun(t, "first 20 steps", toml, killed, killed+"-first.jsonl", 2)
		step20 := filepath.Join(killed, checkpoint.StepName(20))
		for {
			if _, err := os.Stat(step20); err == nil {
				break
			}
			select {
			case <-p.done:
				t.Fatalf("gorun exited before %s existed", step20)
			case <-time.After(2 * time.Millisecond):
			}
		}
		// SIGKILL gorun: its workers die by their parent-death signal (p.wait checks none is left).
		if err := p.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		p.wait()
		from := newestStep(t, killed)
		if from < 20 || from >= 40 {
			t.Fatalf("newest checkpoint after the kill is step %d, want 20..35 (did the run outpace the kill?)", from)
		}
		t.Logf("killed with step %d the newest checkpoint", from)
		other := filepath.Join(root, "killed-other-size")
		if err := os.CopyFS(other, os.DirFS(killed)); err != nil {
			t.Fatal(err)
		}

		r := resumeRun(t, "restart at 2", toml, killed, killed+".jsonl", 2).wait()
		if r.ExitCode != 0 || !strings.Contains(r.Stdout, fmt.Sprintf("loading %s: resuming at step %d", checkpoint.StepName(from), from)) {
			t.Fatalf("restart: exit %d, want 0 and a line saying it resumed at step %d", r.ExitCode, from)
		}
		requireSteps(t, killed+".jsonl", int(from)+1, 40)
		requireEqual(t, straight, killed)

		r = resumeRun(t, "restart at 4 (ddp)", toml, other, other+".jsonl", 4, "--set", "parallel.mode=ddp").wait()
		if r.ExitCode != 0 || !strings.Contains(r.Stdout, fmt.Sprintf("resuming at step %d, sample %d (saved by 1x2 hsdp", from, 8*from)) {
			t.Fatalf("restart at 4: exit %d, want 0 and a line saying it resumed at step %d from 1x2 hsdp", r.ExitCode, from)
		}
		recs := requireSteps(t, other+".jsonl", int(from)+1, 40)
		var worstLoss float64
		for i, rec := range recs {
			want := straightRecs[int(from)+i].Loss
			worstLoss = max(worstLoss, math.Abs(rec.Loss-want)/math.Abs(want))
		}
		rel := normDiff(t, straight, other)
		d := ckptDiff(t, "1e-5", straight, other)
		t.Logf("2 workers, killed, resumed at 4 (ddp): largest relative loss difference %.2e; ||a-b||/||a|| params %.2e, "+
			"optim.m %.2e, optim.v %.2e; gorun ckpt diff --rtol 1e-5 (element-wise, not asserted): exit %d: %s",
			worstLoss, rel["params"], rel["optim.m"], rel["optim.v"], d.ExitCode, strings.TrimSpace(lastLine(d.Stdout+d.Stderr)))
		if worstLoss > 1e-5 || rel["params"] > 1e-5 || rel["optim.m"] > 1e-5 || rel["optim.v"] > 1e-5 {
			t.Errorf("resumed at another world size: losses within %.2e, state within %v relative, want <= 1e-5", worstLoss, rel)
		}
	})

	t.Run("corrupt newest", func(t *testing.T) {
		dir := filepath.Join(root, "corrupt")
		if err := os.CopyFS(dir, os.DirFS(straight)); err != nil {
			t.Fatal(err)
		}
		shard := filepath.Join(dir, checkpoint.StepName(40), "shard-00001.bin")
		b, err := os.ReadFile(shard)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0x01
		if err := os.WriteFile(shard, b, 0o644); err != nil {
			t.Fatal(err)
		}
		r := resumeRun(t, "resume past a corrupt checkpoint", toml, dir, dir+".jsonl", 2).wait()
		re := regexp.MustCompile(`checkpoint: checkpoint step-00000040 is corrupt \(.*shard-00001\.bin tensor \S+: crc32c mismatch.*\), loading step-00000035: resuming at step 35`)
		if r.ExitCode != 0 || !re.MatchString(r.Stdout) {
			t.Fatalf("exit %d, want 0 and a log line matching %s", r.ExitCode, re)
		}
		requireSteps(t, dir+".jsonl", 36, 40)
		requireEqual(t, straight, dir)
	})

	stopped := regexp.MustCompile(`checkpointed step (\d+) to \S+ and stopped \((\S+) requested\)`)
	t.Run("SIGUSR1", func(t *testing.T) {
		dir := filepath.Join(root, "usr1")
		p := resumeRun(t, "SIGUSR1 half way", toml, dir, dir+".jsonl", 2)
		if !p.waitOutput(60*time.Second, func(s string) bool { return strings.Contains(s, "step 5/40") }) {
			t.Fatal("no step 5 within 60 s")
		}
		if err := p.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		r := p.wait()
		m := stopped.FindStringSubmatch(r.Stderr)
		if r.ExitCode != 75 || m == nil || m[2] != "requeue" {
			t.Fatalf("exit %d, want 75 and a worker saying it checkpointed for a requeue", r.ExitCode)
		}
		at, _ := strconv.Atoi(m[1])
		if got := newestStep(t, dir); got != int64(at) || at >= 40 {
			t.Fatalf("stopped at step %d, newest checkpoint %d: want the same, before step 40", at, got)
		}
		requireSteps(t, dir+".jsonl", 1, at)
		r = resumeRun(t, "requeued", toml, dir, dir+".jsonl", 2).wait()
		if r.ExitCode != 0 || !strings.Contains(r.Stdout, fmt.Sprintf("resuming at step %d", at)) {
			t.Fatalf("requeued run: exit %d, want 0 and a line saying it resumed at step %d", r.ExitCode, at)
		}
		requireSteps(t, dir+".jsonl", 1, 40) // the metrics go on where they stopped: no step lost or repeated
		requireEqual(t, straight, dir)
	})

	t.Run("SIGTERM", func(t *testing.T) {
		dir := filepath.Join(root, "term")
		p := resumeRun(t, "SIGTERM half way", toml, dir, dir+".jsonl", 2)
		if !p.waitOutput(60*time.Second, func(s string) bool { return strings.Contains(s, "step 5/40") }) {
			t.Fatal("no step 5 within 60 s")
		}
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		r := p.wait()
		m := stopped.FindStringSubmatch(r.Stderr)
		if r.ExitCode != 128+int(syscall.SIGTERM) || m == nil || m[2] != "terminate" {
			t.Fatalf("exit %d, want %d and a worker saying it checkpointed on SIGTERM", r.ExitCode, 128+int(syscall.SIGTERM))
		}
		if at, _ := strconv.Atoi(m[1]); newestStep(t, dir) != int64(at) {
			t.Fatalf("stopped at step %d, newest checkpoint %d: want the same", at, newestStep(t, dir))
		}
	})
}
