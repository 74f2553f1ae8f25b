package proc_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gorun/gorun/internal/proc"
)

// deadline bounds every wait in these tests; nothing is expected to take more than a fraction.
const deadline = 10 * time.Second

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runRole(role))
	}
	catchIgnoredSIGINT()
	goleak.VerifyTestMain(m)
}

// catchIgnoredSIGINT makes the workers start with SIGINT at its default
// (death), as gorun's do, when this test was started with it ignored (a
// background job of a non-interactive shell): an ignored signal stays
// ignored across exec, a caught one is reset to the default. Caught into
// a channel nobody reads, SIGINT stays without effect on the test itself.
func catchIgnoredSIGINT() {
	if signal.Ignored(syscall.SIGINT) {
		signal.Notify(make(chan os.Signal, 1), syscall.SIGINT)
	}
}

// recorder is an io.Writer (not an *os.File, so the process writes into a pipe) that keeps what it
// gets and closes ready once it has seen the line "ready".
type recorder struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	once  sync.Once
	ready chan struct{}
}

func newRecorder() *recorder {
	return &recorder{ready: make(chan struct{})}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf.Write(p)
	if strings.Contains(r.buf.String(), "ready\n") {
		r.once.Do(func() { close(r.ready) })
	}
	return len(p), nil
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.String()
}

// waitReady waits until the worker writing to r has said it is ready.
func (r *recorder) waitReady(t *testing.T) {
	t.Helper()
	select {
	case <-r.ready:
	case <-time.After(deadline):
		t.Fatalf("worker not ready after %v; output so far: %q", deadline, r.String())
	}
}

// worker returns the Spec of the test binary running role with arg; file is where the role writes
// a PID, if it does.
func worker(role, arg, file string) proc.Spec {
	return proc.Spec{Path: self(), Env: roleEnviron(role, arg, file)}
}

// start starts spec and kills it at the end of the test.
func start(t *testing.T, spec proc.Spec) *proc.Process {
	t.Helper()
	p, err := proc.Start(spec)
	require.NoError(t, err)
	t.Cleanup(func() { p.Stop(syscall.SIGKILL, 0) })
	return p
}

// wait waits for p to be reaped, within the deadline.
func wait(t *testing.T, p *proc.Process) proc.Result {
	t.Helper()
	select {
	case <-p.Done():
		return p.Result()
	case <-time.After(deadline):
		t.Fatalf("process %d not reaped after %v", p.PID(), deadline)
		return proc.Result{}
	}
}

// readPID waits for a role to write a PID to path and returns it; the process with that PID is
// killed at the end of the test if it is still one of ours.
func readPID(t *testing.T, path string) int {
	t.Helper()
	end := time.Now().Add(deadline)
	for {
		data, err := os.ReadFile(path)
		if err == nil {
			pid, err := strconv.Atoi(string(data))
			require.NoError(t, err)
			t.Cleanup(func() { killOurs(pid) })
			return pid
		}
		require.ErrorIs(t, err, fs.ErrNotExist)
		require.True(t, time.Now().Before(end), "no PID in %s after %v", path, deadline)
		time.Sleep(10 * time.Millisecond)
	}
}

// killOurs kills pid if it is still a test worker (its PID may have been reused otherwise).
func killOurs(pid int) {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err == nil && bytes.Contains(env, []byte(roleEnv+"=")) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// alive reports whether pid is a live process: a zombie, waiting for init to reap it, is dead.
func alive(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may contain anything.
	rest := stat[bytes.LastIndexByte(stat, ')')+1:]
	state := strings.Fields(string(rest))[0]
	return state != "Z" && state != "X"
}

// requireGone waits, within the deadline, for pid to die.
func requireGone(t *testing.T, pid int) {
	t.Helper()
	end := time.Now().Add(deadline)
	for alive(pid) {
		require.True(t, time.Now().Before(end), "process %d still alive after %v", pid, deadline)
		time.Sleep(10 * time.Millisecond)
	}
}

func TestExit(t *testing.T) {
	tests := []struct {
		name     string
		role     string
		arg      string
		wantCode int
		wantSig  syscall.Signal
		wantStr  string
	}{
		{"exit 0", "exit", "0", 0, 0, "exit status 0"},
		{"exit 1", "exit", "1", 1, 0, "exit status 1"},
		{"exit 3", "exit", "3", 3, 0, "exit status 3"},
		{"SIGTERM", "kill", "15", 143, syscall.SIGTERM, "killed by SIGTERM (exit 143)"},
		{"SIGKILL", "kill", "9", 137, syscall.SIGKILL, "killed by SIGKILL (exit 137)"},
		{"SIGSEGV", "kill", "11", 139, syscall.SIGSEGV, "killed by SIGSEGV (exit 139)"},
		{"SIGABRT", "kill", "6", 134, syscall.SIGABRT, "killed by SIGABRT (exit 134)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spec := worker(tt.role, tt.arg, "")
			spec.Dir = t.TempDir()
			p := start(t, spec)
			r := wait(t, p)
			assert.Equal(t, p.PID(), r.PID)
			assert.Equal(t, tt.wantCode, r.ExitCode)
			assert.Equal(t, tt.wantSig, r.Signal)
			assert.Equal(t, tt.wantCode == 0, r.Success())
			assert.Equal(t, tt.wantStr, r.String())
			assert.NoError(t, r.Err)
			assert.False(t, r.Started.IsZero())
			assert.False(t, r.Ended.Before(r.Started))
		})
	}
}

func TestStop(t *testing.T) {
	tests := []struct {
		name     string
		role     string
		arg      string
		ready    bool // wait for the worker to say "ready" before stopping it
		sig      syscall.Signal
		grace    time.Duration
		wantCode int
		wantSig  syscall.Signal
	}{
		{"ignores SIGTERM: killed after grace", "ignore-term", "", true, syscall.SIGTERM, 100 * time.Millisecond, 137, syscall.SIGKILL},
		{"handles SIGTERM: own exit code", "handle-term", "7", true, syscall.SIGTERM, deadline, 7, 0},
		{"default SIGTERM: dies of it", "sleep", "", false, syscall.SIGTERM, deadline, 143, syscall.SIGTERM},
		{"SIGINT", "sleep", "", false, syscall.SIGINT, deadline, 130, syscall.SIGINT},
		{"SIGKILL at once", "ignore-term", "", true, syscall.SIGKILL, deadline, 137, syscall.SIGKILL},
		{"no grace", "ignore-term", "", true, syscall.SIGTERM, 0, 137, syscall.SIGKILL},
		{"already exited", "exit", "3", false, syscall.SIGTERM, deadline, 3, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out := newRecorder()
			spec := worker(tt.role, tt.arg, "")
			spec.Stdout = out
			p := start(t, spec)
			if tt.ready {
				out.waitReady(t)
			}
			if tt.role == "exit" {
				wait(t, p)
			}
			stopped := make(chan proc.Result, 1)
			go func() { stopped <- p.Stop(tt.sig, tt.grace) }()
			var r proc.Result
			select {
			case r = <-stopped:
			case <-time.After(deadline + deadline):
				t.Fatal("Stop did not return")
			}
			assert.Equal(t, tt.wantCode, r.ExitCode)
			assert.Equal(t, tt.wantSig, r.Signal)
			assert.Equal(t, r, p.Result())
			assert.ErrorIs(t, p.Signal(syscall.SIGTERM), os.ErrProcessDone)
		})
	}
}

func TestStopAll(t *testing.T) {
	var ps []*proc.Process
	for _, w := range []struct{ role, arg string }{{"ignore-term", ""}, {"handle-term", "5"}, {"ignore-term", ""}} {
		out := newRecorder()
		spec := worker(w.role, w.arg, "")
		spec.Stdout = out
		ps = append(ps, start(t, spec))
		out.waitReady(t)
	}
	sleeper := start(t, worker("sleep", "", ""))
	ps = append(ps, nil, sleeper)

	done := make(chan struct{})
	go func() {
		killed := proc.StopAll(ps, syscall.SIGTERM, 200*time.Millisecond, nil)
		assert.True(t, killed, "two processes ignore SIGTERM: StopAll had to send SIGKILL")
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(deadline):
		t.Fatal("StopAll did not return")
	}
	want := []int{137, 5, 137, 0, 143} // the 0 is for the nil entry
	for i, p := range ps {
		if p == nil {
			continue
		}
		select {
		case <-p.Done():
		default:
			t.Fatalf("process %d not reaped when StopAll returned", i)
		}
		assert.Equal(t, want[i], p.Result().ExitCode, "process %d", i)
	}
}

func TestGrandchildKilled(t *testing.T) {
	tests := []struct {
		name     string
		mode     string
		stop     bool
		wantCode int
	}{
		{"leader exits 0", "exit", false, 0},
		{"leader stopped", "hang", true, 143},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pidFile := filepath.Join(t.TempDir(), "grandchild.pid")
			out := newRecorder()
			spec := worker("fork", tt.mode, pidFile)
			spec.Stdout = out
			p := start(t, spec)
			grandchild := readPID(t, pidFile)
			if tt.stop {
				out.waitReady(t)
				require.True(t, alive(grandchild))
				assert.Equal(t, tt.wantCode, p.Stop(syscall.SIGTERM, deadline).ExitCode)
			}
			assert.Equal(t, tt.wantCode, wait(t, p).ExitCode)
			requireGone(t, grandchild)
		})
	}
}

// A grandchild in its own session escapes the group kill (documented); holding the output pipe
// open must still not keep Done from closing.
func TestSetsidGrandchildDoesNotHangDone(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "grandchild.pid")
	spec := worker("fork", "setsid", pidFile)
	spec.Stdout = newRecorder()
	p := start(t, spec)
	grandchild := readPID(t, pidFile)
	r := wait(t, p)
	assert.Equal(t, 0, r.ExitCode)
	assert.ErrorIs(t, r.Err, exec.ErrWaitDelay)
	assert.True(t, alive(grandchild), "a setsid grandchild escapes the process group")
}

// When the process that called Start is killed, the parent-death signal kills its child.
func TestParentDeathSignal(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	parent := start(t, worker("parent", "", pidFile))
	child := readPID(t, pidFile)
	require.True(t, alive(child))

	require.NoError(t, syscall.Kill(parent.PID(), syscall.SIGKILL))
	assert.Equal(t, syscall.SIGKILL, wait(t, parent).Signal)
	requireGone(t, child)
}

// When the process that called Start is killed, its guard kills the whole
// group of each worker, grandchildren included.
func TestGuardKillsGroupWhenParentIsKilled(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "grandchild.pid")
	parent := start(t, worker("guarded-parent", "", pidFile))
	grandchild := readPID(t, pidFile)
	require.True(t, alive(grandchild))

	require.NoError(t, syscall.Kill(parent.PID(), syscall.SIGKILL))
	assert.Equal(t, syscall.SIGKILL, wait(t, parent).Signal)
	requireGone(t, grandchild)
}

// TestRunGuard runs the guard as its own process, as gorun does: RunGuard
// ignores the stop signals, and an ignored signal would stay ignored in
// every worker this test binary starts afterwards.
func TestRunGuard(t *testing.T) {
	tests := []struct {
		name, input string
		code        int
		stderr      string
	}{
		{"empty", "", 0, ""},
		{"watch and forget", "+999999999\n-999999999\n", 0, ""},
		{"bad line", "+x\n", 1, `bad line "+x"`},
		{"bad op", "*12\n", 1, `bad line "*12"`},
		{"relative dir", "dtmp/x\n", 1, `bad line "dtmp/x"`},
		{"root dir", "d/\n", 1, `bad line "d/"`},
		{"unclean dir", "d/tmp/../x\n", 1, `bad line "d/tmp/../x"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(self())
			cmd.Env = roleEnviron("guard", "", "")
			cmd.Stdin = strings.NewReader(tc.input)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			if tc.code == 0 {
				require.NoError(t, err, stderr.String())
				return
			}
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit)
			require.Equal(t, tc.code, exit.ExitCode())
			require.Contains(t, stderr.String(), tc.stderr)
		})
	}
}

// Once its input ends, the guard removes the directories it was given
// (with what is in them), after the groups it kills: a SIGKILLed gorun's
// snapshot directory goes with it. One that is already gone is no error.
func TestRunGuardRemovesDirs(t *testing.T) {
	tmp := t.TempDir()
	full, gone := filepath.Join(tmp, "full"), filepath.Join(tmp, "gone")
	require.NoError(t, os.MkdirAll(filepath.Join(full, "python", "gorun"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(full, "rank-0.slot0"), []byte("x"), 0o600))
	var g *proc.Guard
	require.NoError(t, g.RemoveAtExit(full), "a nil Guard takes a good path")
	require.Error(t, g.RemoveAtExit("relative"))
	cmd := exec.Command(self())
	cmd.Env = roleEnviron("guard", "", "")
	cmd.Stdin = strings.NewReader("d" + full + "\nd" + gone + "\n")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	_, err = os.Stat(full)
	require.ErrorIs(t, err, fs.ErrNotExist, "the guard left %s", full)
	require.DirExists(t, tmp, "only the directory named goes")
}

func TestOutput(t *testing.T) {
	stdout := newRecorder()
	stderr, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	require.NoError(t, err)
	defer stderr.Close()

	spec := worker("print", "", "")
	spec.Stdout = stdout // a pipe, drained before Done
	spec.Stderr = stderr // handed to the process as is
	r := wait(t, start(t, spec))
	require.True(t, r.Success(), r.String())

	assert.Equal(t, "out 1\nout 2\nout 3\nno newline", stdout.String())
	data, err := os.ReadFile(stderr.Name())
	require.NoError(t, err)
	assert.Equal(t, "err 1\nerr 2\nerr 3\n", string(data))
}

func TestEnvAndDir(t *testing.T) {
	dir := t.TempDir()
	out := newRecorder()
	spec := worker("env", "hello", "")
	spec.Dir = dir
	spec.Stdout = out
	r := wait(t, start(t, spec))
	require.True(t, r.Success(), r.String())
	assert.Equal(t, "hello "+dir+"\n", out.String())
}

func TestStartError(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	tests := []struct {
		name    string
		spec    proc.Spec
		wantIn  string
		wantErr error
	}{
		{"no such file", proc.Spec{Path: missing}, missing, fs.ErrNotExist},
		{"not in PATH", proc.Spec{Path: "gorun-no-such-command"}, "gorun-no-such-command", exec.ErrNotFound},
		{"no such dir", proc.Spec{Path: self(), Dir: missing}, self(), fs.ErrNotExist},
		{"empty path", proc.Spec{}, "empty path", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := proc.Start(tt.spec)
			require.Error(t, err)
			assert.Nil(t, p)
			assert.Contains(t, err.Error(), tt.wantIn)
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr)
			}
		})
	}
}

func TestSignalGroup(t *testing.T) {
	out := newRecorder()
	spec := worker("handle-term", "4", "")
	spec.Stdout = out
	p := start(t, spec)
	out.waitReady(t)
	assert.Equal(t, -1, p.Result().ExitCode, "Result before Done")
	require.NoError(t, p.Signal(syscall.SIGTERM))
	assert.Equal(t, 4, wait(t, p).ExitCode)
	assert.ErrorIs(t, p.Signal(syscall.SIGTERM), os.ErrProcessDone)
}

func TestResultString(t *testing.T) {
	tests := []struct {
		r    proc.Result
		want string
	}{
		{proc.Result{ExitCode: 0}, "exit status 0"},
		{proc.Result{ExitCode: 3}, "exit status 3"},
		{proc.Result{ExitCode: 137, Signal: syscall.SIGKILL}, "killed by SIGKILL (exit 137)"},
		{proc.Result{ExitCode: 128 + 64, Signal: 64}, "killed by signal 64 (exit 192)"},
		{proc.Result{ExitCode: -1, Err: errors.New("boom")}, "unknown end: boom"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.r.String())
			assert.Equal(t, tt.want == "exit status 0", tt.r.Success())
		})
	}
}

// gorun can die between forking a worker and telling the guard its group:
// the guard, given only the mark, still kills the marked processes and
// their groups once its input ends. Here a marked shell in a group of its
// own forks a grandchild (which inherits the mark) and the guard is told
// nothing else.
func TestRunGuardKillsMarkedProcesses(t *testing.T) {
	dir := t.TempDir()
	const mark = "0123456789abcdef0123456789abcdef"
	sh := exec.Command("/bin/sh", "-c", `sleep 300 & printf %s $! > "$1/g"; mv "$1/g" "$1/grandchild"; printf %s $$ > "$1/w"; mv "$1/w" "$1/worker"; wait`, "sh", dir)
	sh.Env = append(os.Environ(), proc.GuardMarkEnv+"="+mark)
	sh.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	require.NoError(t, sh.Start())
	reaped := make(chan struct{})
	go func() { _ = sh.Wait(); close(reaped) }()
	t.Cleanup(func() { _ = syscall.Kill(-sh.Process.Pid, syscall.SIGKILL); <-reaped })
	grandchild := readPID(t, filepath.Join(dir, "grandchild"))
	readPID(t, filepath.Join(dir, "worker")) // the shell has forked

	unmarked := exec.Command("sleep", "300")
	require.NoError(t, unmarked.Start())
	t.Cleanup(func() { _ = unmarked.Process.Kill(); _ = unmarked.Wait() })

	guard := exec.Command(self())
	guard.Env = roleEnviron("guard", "", "")
	guard.Stdin = strings.NewReader("=" + mark + "\n")
	out, err := guard.CombinedOutput()
	require.NoError(t, err, string(out))
	<-reaped
	requireGone(t, grandchild)
	require.True(t, alive(unmarked.Process.Pid), "a process without the mark is left alone")
}

// Close ends a guard that watches no group without letting it act on the
// end of its input (kill what is watched, scan /proc for its mark): it
// kills it. With a group still watched, the guard reads the end of its
// input and acts. The guard here is a shell that, at the end of its
// input, writes a file, so the file tells whether it was let act.
func TestGuardClose(t *testing.T) {
	tests := []struct {
		name    string
		watch   []int // groups told with Watch
		forget  []int // then with Forget
		wantEOF bool  // the guard read the end of its input
	}{
		{"nothing watched: killed", nil, nil, false},
		{"every group forgotten: killed", []int{999999999}, []int{999999999}, false},
		{"a group still watched: told", []int{999999999}, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "eof")
			guard, err := proc.StartGuard([]string{"/bin/sh", "-c", `while read -r line; do :; done; : > "$0"`, file})
			require.NoError(t, err)
			for _, pgid := range tc.watch {
				guard.Watch(pgid)
			}
			for _, pgid := range tc.forget {
				guard.Forget(pgid)
			}
			require.NoError(t, guard.Close())
			_, err = os.Stat(file)
			if tc.wantEOF {
				require.NoError(t, err, "the guard acted on the end of its input")
			} else {
				require.ErrorIs(t, err, fs.ErrNotExist, "Close let the guard act on the end of its input")
			}
		})
	}
}
