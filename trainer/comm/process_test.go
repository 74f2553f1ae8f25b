package comm

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/internal/testutil"
)

// childEnv marks the test binary re-executed as one rank.
const childEnv = "COMM_TEST_CHILD"

// runChild is one rank: all-reduce in a loop, print "ready" after the
// first, and "error: ..." (exit 3) when a collective fails. It gives up
// by itself after a minute, so no process outlives a broken test.
func runChild() int {
	atoi := func(k string) int { v, _ := strconv.Atoi(os.Getenv(k)); return v }
	timeout, _ := time.ParseDuration(os.Getenv("COMM_TEST_TIMEOUT"))
	secret, err := jobsecret.FromEnv(os.LookupEnv)
	if err != nil {
		fmt.Printf("error: %v\n", err)
		return 2
	}
	cfg := Config{
		Rank: atoi("RANK"), WorldSize: atoi("WORLD_SIZE"), MasterAddr: "127.0.0.1",
		MasterPort: atoi("MASTER_PORT"), Token: "proc/0", Timeout: timeout,
		Secret: secret, Log: os.Stderr,
	}
	if d, err := time.ParseDuration(os.Getenv("COMM_TEST_SILENT_AFTER")); err == nil {
		cfg.SilentAfter = d
		cfg.OnSilent = func(rank int) { fmt.Printf("silent %d\n", rank) }
	}
	w, err := Connect(context.Background(), cfg)
	if err != nil {
		fmt.Printf("error: %v\n", err)
		return 3
	}
	defer w.Close()
	buf := make([]float32, 1<<20)
	start := time.Now()
	for k := 0; time.Since(start) < time.Minute; k++ {
		if err := w.All().AllReduce(buf); err != nil {
			fmt.Printf("error: %v\n", err)
			return 3
		}
		if k == 0 {
			fmt.Println("ready")
		}
	}
	return 0
}

type child struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr string // a file the child writes to itself: what it wrote before it acted is there
}

// errText is what the child wrote to its stderr so far.
func (k *child) errText(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(k.stderr)
	require.NoError(t, err)
	return string(b)
}

func startChildren(t *testing.T, size int, timeout time.Duration) []*child {
	t.Helper()
	port := testutil.FreePort(t)
	kids := make([]*child, size)
	for r := range size {
		kids[r] = startChild(t, r, size, port, timeout)
	}
	return kids
}

// startChild starts the test binary as rank r (runChild) with env added
// to its environment; it is killed when the test ends.
func startChild(t *testing.T, r, size, port int, timeout time.Duration, env ...string) *child {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(size),
		"MASTER_PORT="+strconv.Itoa(port), "COMM_TEST_TIMEOUT="+timeout.String())
	cmd.Env = append(cmd.Env, env...)
	k := &child{cmd: cmd, lines: make(chan string, 16), stderr: filepath.Join(t.TempDir(), "stderr")}
	f, err := os.Create(k.stderr)
	require.NoError(t, err)
	defer f.Close() // the child has its own copy
	cmd.Stderr = f
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	go func() {
		defer close(k.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			k.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = k.cmd.Process.Kill()
		_ = k.cmd.Wait()
	})
	return k
}

// line returns the child's next output line, or fails the test after wait.
func (k *child) line(t *testing.T, wait time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-k.lines:
		require.True(t, ok, "rank exited without a line")
		return l
	case <-time.After(wait):
		require.FailNow(t, "no line from the rank in time")
		return ""
	}
}

func TestDeadPeer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		signal syscall.Signal
		want   string
	}{
		{"killed", syscall.SIGKILL, "process died?"},
		{"stopped", syscall.SIGSTOP, "stalled?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const size, victim = 4, 1
			timeout := 3 * time.Second
			kids := startChildren(t, size, timeout)
			for r, k := range kids {
				require.Equal(t, "ready", k.line(t, 30*time.Second), "rank %d", r)
			}
			require.NoError(t, kids[victim].cmd.Process.Signal(tc.signal))
			for r, k := range kids {
				if r == victim {
					continue
				}
				// Bounded: the timeout, plus slack for a loaded machine.
				l := k.line(t, 2*timeout+10*time.Second)
				require.True(t, strings.HasPrefix(l, "error: "), "rank %d: %s", r, l)
				require.Contains(t, l, fmt.Sprintf("peer rank %d", victim), "rank %d", r)
				require.Contains(t, l, tc.want, "rank %d", r)
			}
		})
	}
}

// A stopped peer is reported silent (Config.OnSilent) by every other rank
// after SilentAfter, once, without failing their world (Timeout is ten
// minutes: nothing else could end a wait).
func TestSilentPeer(t *testing.T) {
	const size, victim = 3, 2
	port := testutil.FreePort(t)
	kids := make([]*child, size)
	for r := range kids {
		kids[r] = startChild(t, r, size, port, 10*time.Minute, "COMM_TEST_SILENT_AFTER=300ms")
	}
	for r, k := range kids {
		require.Equal(t, "ready", k.line(t, 30*time.Second), "rank %d: %s", r, k.errText(t))
	}
	require.NoError(t, kids[victim].cmd.Process.Signal(syscall.SIGSTOP))
	for r, k := range kids[:victim] {
		require.Equal(t, fmt.Sprintf("silent %d", victim), k.line(t, time.Minute), "rank %d: %s", r, k.errText(t))
	}
	require.NoError(t, kids[victim].cmd.Process.Signal(syscall.SIGCONT))
	for r, k := range kids[:victim] {
		select {
		case l := <-k.lines:
			t.Fatalf("rank %d: %q after the silence: once is enough, and the world must not fail", r, l)
		default:
		}
	}
}

// Processes started by hand with the torchrun environment: one with the
// wrong secret is refused (both sides say so) and the job is unaffected;
// one with the right secret joins as the rank it claims.
func TestHandStartedWorkers(t *testing.T) {
	const size = 3
	right := jobsecret.EnvVar + "=" + strings.Repeat("a1", 32)
	wrong := jobsecret.EnvVar + "=" + strings.Repeat("b2", 32)
	port := testutil.FreePort(t)
	timeout := 10 * time.Second
	rank0 := startChild(t, 0, size, port, timeout, right)
	rank1 := startChild(t, 1, size, port, timeout, right)

	impostor := startChild(t, 2, size, port, timeout, wrong)
	l := impostor.line(t, 30*time.Second)
	require.Contains(t, l, "error: ", l)
	require.Contains(t, l, "authentication failed: wrong GORUN_JOB_SECRET?")
	require.Error(t, impostor.cmd.Wait())
	require.Equal(t, 3, impostor.cmd.ProcessState.ExitCode(), "the impostor failed to connect")
	require.Contains(t, rank0.errText(t), "bootstrap store refused a connection from 127.0.0.1:")
	require.Contains(t, rank0.errText(t), "authentication failed: wrong GORUN_JOB_SECRET? (it claimed rank 2)")

	member := startChild(t, 2, size, port, timeout, right)
	for r, k := range []*child{rank0, rank1, member} {
		require.Equal(t, "ready", k.line(t, 30*time.Second), "rank %d: %s", r, k.errText(t))
	}
}
