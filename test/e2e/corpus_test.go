package e2e

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/test/harness"
)

// noGoEnv is an environment with no $GOROOT and a PATH on which there is
// no go command, as on a cluster node without Go.
func noGoEnv(t *testing.T) []string {
	t.Helper()
	path := "/usr/bin:/bin"
	for _, dir := range filepath.SplitList(path) {
		if _, err := os.Stat(filepath.Join(dir, "go")); err == nil {
			t.Fatalf("%s/go exists: this test needs a PATH without go", dir)
		}
	}
	return []string{"PATH=" + path, "HOME=" + t.TempDir()}
}

// TestExampleRunsWithoutGo: examples/train.toml, copied alone to an empty
// directory, plans and trains on two workers from the gorun binary with
// no Go on the machine's PATH and no $GOROOT: it reads the built-in corpus.
// gorun metrics plot draws the run's metrics as PNG and SVG.
func TestExampleRunsWithoutGo(t *testing.T) {
	dir := t.TempDir()
	example, err := os.ReadFile(filepath.Join(moduleRoot, "examples", "train.toml"))
	if err != nil {
		t.Fatal(err)
	}
	toml := filepath.Join(dir, "train.toml")
	if err := os.WriteFile(toml, example, 0o644); err != nil {
		t.Fatal(err)
	}
	env := noGoEnv(t)
	run := func(args ...string) (string, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, gorunBin, args...)
		cmd.Dir, cmd.Env = dir, env
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = stopGrace
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("gorun %s: %v\n%s", strings.Join(args, " "), err, harness.Tail(stderr.String(), 20))
		}
		return stdout.String(), stderr.String()
	}
	run("plan", "--nproc-per-node=2", "train.toml")
	stdout, _ := run("--nproc-per-node=2", "train.toml", "--set", "train.steps=20", "--set", "optim.warmup=5")
	if !strings.Contains(stdout, "in 1 files") {
		t.Errorf("the trainer did not read the one built-in corpus:\n%s", harness.Tail(stdout, 20))
	}
	if recs := readMetrics(t, filepath.Join(dir, "metrics.jsonl")); len(recs) != 20 || recs[19].WorldSize != 2 {
		t.Errorf("metrics: %d records (want 20) of world size %v", len(recs), recs)
	}
	run("metrics", "plot", "metrics.jsonl", "-o", "loss.png")
	run("metrics", "plot", "metrics.jsonl", "-o", "loss.svg")
	f, err := os.Open(filepath.Join(dir, "loss.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if img, err := png.Decode(f); err != nil || img.Bounds().Dx() != 800 || img.Bounds().Dy() != 600 {
		t.Errorf("loss.png: %v, want an 800 x 600 PNG", err)
	}
	if svg, err := os.ReadFile(filepath.Join(dir, "loss.svg")); err != nil || !bytes.Contains(svg, []byte("<svg")) {
		t.Errorf("loss.svg: %v, want an SVG image", err)
	}
}
