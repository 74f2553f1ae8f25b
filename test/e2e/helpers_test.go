package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/test/harness"
)

const (
	// runTimeout bounds every gorun invocation.
	runTimeout = 120 * time.Second
	// stopGrace is how long a cancelled gorun gets after SIGTERM before SIGKILL.
	stopGrace = 10 * time.Second
	// markerEnv is set to a unique value in each gorun's environment (not
	// GORUN_*: gorun reads that prefix as its own settings); workers
	// inherit it, which is how leftovers are found and killed.
	markerEnv = "E2E_GORUN_MARKER"
)

var (
	// gorunBin is the binary under test, built by TestMain.
	gorunBin string
	// moduleRoot is the repository root (holds go.mod).
	moduleRoot string
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	moduleRoot = filepath.Clean(filepath.Join(wd, "..", ".."))
	if _, err := os.Stat(filepath.Join(moduleRoot, "go.mod")); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: module root %s has no go.mod: %v\n", moduleRoot, err)
		return 1
	}
	if bin := os.Getenv("GORUN_BIN"); bin != "" {
		gorunBin, err = filepath.Abs(bin)
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "gorun-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	gorunBin = filepath.Join(dir, "gorun")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// gorun-worker beside gorun: the agent runs train.toml workers with it,
	// as an install does (TestLeanWorker checks which binary ran).
	build := exec.CommandContext(ctx, "go", "build", "-o", dir+"/", "./cmd/gorun", "./cmd/gorun-worker")
	build.Dir = moduleRoot
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building the gorun binaries (go build ./cmd/gorun ./cmd/gorun-worker in %s) failed: %v\n%s",
			moduleRoot, err, out)
		return 1
	}
	return m.Run()
}

// torch is the interpreter the DDP tests use ($E2E_PYTHON, else
// /usr/bin/python3), probed for PyTorch once for all of them:
// torch.Require(t) skips a test without it, or fails it when CI=true.
var torch = testutil.Torch{Python: defaultPython()}

// gorunProc is one running gorun.
type gorunProc struct {
	t      *testing.T
	name   string
	args   []string
	cmd    *exec.Cmd
	cancel context.CancelFunc
	marker string
	tmpDir string // its TMPDIR
	stdout *testutil.SyncBuffer
	stderr *testutil.SyncBuffer
	done   chan struct{}
	res    result
}

// result is what a finished gorun left.
type result struct {
	Stdout, Stderr string
	// ExitCode is the process exit status, or -1 when it died of a signal.
	ExitCode int
	// Err is the error from Wait (nil on exit 0), e.g. a timeout.
	Err error
	// TimedOut says the run hit runTimeout and was stopped.
	TimedOut bool
}

// startGorun starts gorun with args in the test's environment plus
// PYTHON=<torch interpreter> and extraEnv: KEY=VALUE sets, a bare KEY unsets. The process is bounded by runTimeout; t.Cleanup stops it and
// kills everything it started.
func startGorun(t *testing.T, name string, extraEnv []string, args ...string) *gorunProc {
	t.Helper()
	return startProc(t, name, gorunBin, extraEnv, args...)
}

// startProc is startGorun for any launcher binary (e.g. torchrun for a comparison).
func startProc(t *testing.T, name, bin string, extraEnv []string, args ...string) *gorunProc {
	t.Helper()
	return startProcWithin(t, runTimeout, name, bin, extraEnv, args...)
}

// startProcWithin is startProc bounded by timeout instead of runTimeout, for a run that lasts
// longer by design (a network fault of minutes).
func startProcWithin(t *testing.T, timeout time.Duration, name, bin string, extraEnv []string, args ...string) *gorunProc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	p := &gorunProc{
		t: t, name: name, args: args, cancel: cancel, marker: newMarker(t), tmpDir: t.TempDir(),
		stdout: &testutil.SyncBuffer{}, stderr: &testutil.SyncBuffer{}, done: make(chan struct{}),
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = moduleRoot
	// TMPDIR: a killed agent cannot remove its embedded etcd's data dir (over 100 MB) or its
	// error files; the test's temporary directory goes with the test.
	cmd.Env = buildEnv(append([]string{"PYTHON=" + defaultPython(), markerEnv + "=" + p.marker, "TMPDIR=" + p.tmpDir}, extraEnv...))
	cmd.Stdout = p.stdout
	cmd.Stderr = p.stderr
	// On timeout or cleanup: ask gorun to stop (it must forward to its
	// workers), and give it stopGrace before Go sends SIGKILL.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopGrace
	p.cmd = cmd
	t.Logf("%s: %s %s", name, filepath.Base(bin), shellQuote(args))
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("%s: starting gorun: %v", name, err)
	}
	go func() {
		defer close(p.done)
		err := cmd.Wait()
		p.res = result{
			Stdout: p.stdout.String(), Stderr: p.stderr.String(),
			ExitCode: cmd.ProcessState.ExitCode(), Err: err,
			TimedOut: errors.Is(ctx.Err(), context.DeadlineExceeded),
		}
	}()
	t.Cleanup(func() {
		cancel() // SIGTERM if still running
		select {
		case <-p.done:
		case <-time.After(stopGrace + 5*time.Second):
			t.Errorf("%s: gorun did not exit after SIGTERM and SIGKILL", name)
		}
		if left := killMarked(p.marker); len(left) > 0 {
			t.Errorf("%s: processes left behind after gorun exited (killed now): %s", name, strings.Join(left, "; "))
		}
	})
	return p
}

// wait waits for gorun to exit and returns what it left; it also checks that
// no process started by this run is still alive once gorun has exited.
func (p *gorunProc) wait() result {
	p.t.Helper()
	<-p.done
	p.cancel()
	r := p.res
	if r.TimedOut {
		p.t.Errorf("%s: gorun did not finish within its time bound and was stopped", p.name)
	}
	logOutput(p.t, p.name, r)
	// Workers are children of gorun: by the time it has exited they must be
	// gone. Allow a short settling window for the kernel to reap them.
	var left []string
	for i := 0; i < 50; i++ {
		if left = listMarked(p.marker); len(left) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(left) > 0 {
		p.t.Errorf("%s: processes still running after gorun exited: %s", p.name, strings.Join(left, "; "))
		killMarked(p.marker)
	}
	return r
}

// waitOutput polls until cond holds on gorun's stdout, gorun exits, or d passes.
func (p *gorunProc) waitOutput(d time.Duration, cond func(stdout string) bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond(p.stdout.String()) {
			return true
		}
		select {
		case <-p.done:
			return cond(p.stdout.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return false
}

// startAgents starts one gorun agent per name, all at once, agent i with the environment edits
// env and the arguments args(i); each is bounded and cleaned up as startGorun's is.
func startAgents(t *testing.T, names, env []string, args func(i int) []string) []*gorunProc {
	t.Helper()
	agents := make([]*gorunProc, len(names))
	for i, name := range names {
		agents[i] = startGorun(t, name, env, args(i)...)
	}
	return agents
}

// nodeNames are the names node0 .. node<n-1>.
func nodeNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("node%d", i)
	}
	return names
}

// waitAll waits for each agent in turn (gorunProc.wait) and returns their results in order.
func waitAll(agents []*gorunProc) []result {
	results := make([]result, len(agents))
	for i, a := range agents {
		results[i] = a.wait()
	}
	return results
}

// runGorun runs gorun to completion.
func runGorun(t *testing.T, extraEnv []string, args ...string) result {
	t.Helper()
	return startGorun(t, "gorun", extraEnv, args...).wait()
}

// buildEnv returns os.Environ() with edits applied in order: KEY=VALUE sets,
// a bare KEY unsets.
func buildEnv(edits []string) []string {
	env := os.Environ()
	for _, e := range edits {
		key, _, set := strings.Cut(e, "=")
		kept := env[:0:0]
		for _, kv := range env {
			if k, _, _ := strings.Cut(kv, "="); k != key {
				kept = append(kept, kv)
			}
		}
		env = kept
		if set {
			env = append(env, e)
		}
	}
	return env
}

func defaultPython() string {
	if p := os.Getenv("E2E_PYTHON"); p != "" {
		return p
	}
	return "/usr/bin/python3"
}

func logOutput(t *testing.T, name string, r result) {
	t.Helper()
	t.Logf("%s: exit %d (err %v)\n--- stdout ---\n%s--- stderr ---\n%s", name, r.ExitCode, r.Err,
		harness.Tail(r.Stdout, 60), harness.Tail(r.Stderr, 60))
}

func newMarker(t *testing.T) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// listMarked returns "pid cmdline" of every live process whose environment
// carries markerEnv=marker (zombies excluded: they hold nothing).
func listMarked(marker string) []string {
	var out []string
	for _, p := range harness.Marked(markerEnv + "=" + marker) {
		out = append(out, p.String())
	}
	return out
}

// killMarked SIGKILLs every process carrying the marker and returns what it found.
func killMarked(marker string) []string {
	var left []string
	for _, p := range harness.Marked(markerEnv + "=" + marker) {
		left = append(left, p.String())
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
	return left
}

// workerLine is one worker output line as gorun re-emits it.
type workerLine struct {
	Host string
	Rank int
	Text string
}

var prefixRE = regexp.MustCompile(`^\[([^\]:]+):(\d+)\] ?(.*)$`)

// workerLines parses the "[host:rank] text" lines of s; other lines (gorun's
// own log) are ignored.
func workerLines(s string) []workerLine {
	var out []workerLine
	for _, l := range strings.Split(s, "\n") {
		m := prefixRE.FindStringSubmatch(strings.TrimRight(l, "\r"))
		if m == nil {
			continue
		}
		r, _ := strconv.Atoi(m[2])
		out = append(out, workerLine{Host: m[1], Rank: r, Text: m[3]})
	}
	return out
}

// nonEmptyLines returns the non-blank lines of s.
func nonEmptyLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

func shellQuote(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r == '-' || r == '_' || r == '=' || r == '/' || r == '.' || r == ':' || r == ',' ||
				(r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z'))
		}) < 0 {
			q[i] = a
		} else {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}
