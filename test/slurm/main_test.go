package slurmtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gorun/gorun/internal/testutil"
)

var (
	// moduleRoot is the repository root (holds go.mod).
	moduleRoot string
	// binDir holds the gorun binary built for this run.
	binDir string

	buildOnce sync.Once
	gorunBin  string
	buildErr  error

	// torch probes python for PyTorch once for all the tests:
	// torch.Require(t) skips a test without it, or fails it when CI=true.
	torch = testutil.Torch{Python: python}
)

// python is the interpreter with PyTorch the DDP example runs with.
const python = "/usr/bin/python3"

func TestMain(m *testing.M) {
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "slurmtest:", err)
		os.Exit(1)
	}
	moduleRoot = filepath.Clean(filepath.Join(wd, "..", ".."))
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "slurmtest: goroutines left:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// gorun returns the binary under test: $GORUN_BIN, else gorun built once
// from this tree (only when a test needs it).
func gorun(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if bin := os.Getenv("GORUN_BIN"); bin != "" {
			gorunBin, buildErr = filepath.Abs(bin)
			return
		}
		binDir, buildErr = os.MkdirTemp("", "gorun-slurmtest-bin-")
		if buildErr != nil {
			return
		}
		gorunBin = filepath.Join(binDir, "gorun")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		build := exec.CommandContext(ctx, "go", "build", "-o", binDir+"/", "./cmd/gorun", "./cmd/gorun-worker")
		build.Dir = moduleRoot
		if out, err := build.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/gorun ./cmd/gorun-worker in %s: %v\n%s", moduleRoot, err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return gorunBin
}

// render runs gorun sbatch args and returns the script, failing t unless
// it exits 0.
func render(t *testing.T, args ...string) string {
	t.Helper()
	bin := gorun(t) // the first call builds it: not part of the render's bound
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"sbatch"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("gorun sbatch %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// writeFile writes data to dir/name with mode and returns its path.
func writeFile(t *testing.T, dir, name, data string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	return path
}

// waitFiles waits up to within for n files matching pattern.
func waitFiles(t *testing.T, pattern string, n int, within time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		files, _ := filepath.Glob(pattern)
		if len(files) >= n {
			return files
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d files %s after %s, want %d", len(files), pattern, within, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tempDir is a world-readable temporary directory: job output is written
// from the nodes' namespaces.
func tempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
