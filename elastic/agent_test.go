package elastic

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/internal/workerlog"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/rdzvtest"
)

// The test binary re-executes itself as a worker when this variable names a role.
const roleVar = "ELASTIC_TEST_ROLE"

func TestMain(m *testing.M) {
	if role, ok := os.LookupEnv(roleVar); ok {
		os.Exit(runRole(role))
	}
	goleak.VerifyTestMain(m, etcdtest.GoleakOptions()...)
}

// runRole is a worker's life. Roles:
//
//	ok                  exit 0
//	fail:RANK:CODE      rank RANK prints to stderr and exits CODE; others wait for SIGTERM
//	signal:RANK         rank RANK dies of SIGKILL; others wait for SIGTERM
//	errorfile:RANK      rank RANK writes a torchrun error file and exits 1
//	flaky:N[:CODE]      while TORCHELASTIC_RESTART_COUNT < N rank 0 exits CODE (default 5), others wait for SIGTERM
//	wait                wait for SIGTERM, exit 0 on it
//	stubborn            ignore SIGTERM, sleep
//	usr1                exit 0 on SIGUSR1
func runRole(role string) int {
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	restart, _ := strconv.Atoi(os.Getenv("TORCHELASTIC_RESTART_COUNT"))
	fmt.Printf("rank %d of %s started\n", rank, os.Getenv("WORLD_SIZE"))
	// listen catches sig from now on; the function it returns says
	// "ready" and waits for it.
	listen := func(sig os.Signal) (wait func()) {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, sig)
		return func() {
			fmt.Println("ready")
			select {
			case <-ch:
			case <-time.After(60 * time.Second):
			}
		}
	}
	waitFor := func(sig os.Signal) { listen(sig)() }
	kind, args, _ := strings.Cut(role, ":")
	var arg1, arg2 int
	fmt.Sscanf(args, "%d:%d", &arg1, &arg2)
	switch kind {
	case "ok":
		return 0
	case "fail", "signal", "errorfile":
		if rank != arg1 {
			waitFor(syscall.SIGTERM)
			return 0
		}
		time.Sleep(50 * time.Millisecond) // let the others start
		switch kind {
		case "fail":
			fmt.Fprintf(os.Stderr, "Traceback: something\nValueError: rank %d broke\n", rank)
			return arg2
		case "signal":
			syscall.Kill(os.Getpid(), syscall.SIGKILL) // as the OOM killer does
			time.Sleep(10 * time.Second)
			return 0
		default:
			doc := `{"message": {"message": "RuntimeError: out of patience", "extraInfo": {"py_callstack": "File train.py, line 3", "timestamp": "0"}}}`
			os.WriteFile(os.Getenv("TORCHELASTIC_ERROR_FILE"), []byte(doc), 0o644)
			return 1
		}
	case "flaky":
		if restart >= arg1 {
			return 0
		}
		if rank != 0 {
			waitFor(syscall.SIGTERM)
			return 0
		}
		if arg2 != 0 {
			return arg2
		}
		return 5
	case "wait":
		waitFor(syscall.SIGTERM)
		return 0
	case "stdin": // prints the first line of its stdin
		line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
		fmt.Printf("got %s", line)
		return 0
	case "background": // leaves a child that touches $BG_FILE after a while, and succeeds
		cmd := exec.Command("/bin/sh", "-c", `sleep 0.2; touch "$BG_FILE"`)
		if err := cmd.Start(); err != nil {
			return 3
		}
		return 0
	case "stubborn": // ignores every stop signal the agent forwards
		signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
		fmt.Println("ready")
		time.Sleep(60 * time.Second)
		return 0
	case "usr1":
		waitFor(syscall.SIGUSR1)
		return 0
	case "beat-then-hang": // rank 1 reports two steps, then hangs
		b := heartbeat.FromEnv(os.LookupEnv)
		if rank != 1 {
			waitFor(syscall.SIGTERM)
			return 0
		}
		b.Beat(0)
		b.Beat(1)
		time.Sleep(60 * time.Second)
		return 0
	case "requeue": // every worker "checkpoints" on SIGUSR1 and exits 75
		waitFor(syscall.SIGUSR1)
		time.Sleep(time.Duration(rank) * 50 * time.Millisecond)
		return ExitRequeue
	case "report-then-wait": // reports step 1 with figures, then waits for SIGTERM
		// Catch SIGTERM before reporting: the test sends it once it saw the report.
		wait := listen(syscall.SIGTERM)
		heartbeat.FromEnv(os.LookupEnv).Report(heartbeat.Progress{Step: 1, Loss: 2.5, TokensPerS: 100, MFU: 0.5, ComputeS: math.NaN(), Round: math.NaN(), Redone: math.NaN()})
		wait()
		return 0
	case "beat-then-await": // rank 1 reports step 1, says it awaits a round (lost peer 0), waits
		b := heartbeat.FromEnv(os.LookupEnv)
		if rank != 1 {
			waitFor(syscall.SIGTERM)
			return 0
		}
		b.Beat(1)
		b.Await(1, 0)
		time.Sleep(60 * time.Second)
		return 0
	case "slow-no-beats": // never reports: never judged hung
		time.Sleep(500 * time.Millisecond)
		return 0
	}
	return 99
}

type harness struct {
	spec    Spec
	signals chan os.Signal
	stdout  *testutil.SyncBuffer
	report  *testutil.SyncBuffer
}

func newHarness(t *testing.T, role string, workers int) *harness {
	self, err := os.Executable()
	require.NoError(t, err)
	h := &harness{signals: make(chan os.Signal, 4), stdout: &testutil.SyncBuffer{}, report: &testutil.SyncBuffer{}}
	h.spec = Spec{
		RunID: "test", Host: "box", LocalWorkers: workers, Role: "default",
		Command: []string{self}, Environ: append(os.Environ(), roleVar+"="+role, "GORACE=atexit_sleep_ms=0"),
		TermTimeout: 5 * time.Second, ErrorDir: t.TempDir(), Report: h.report, Signals: h.signals,
		Logs:       workerlog.Config{Stdout: h.stdout, Stderr: h.stdout, TailLines: 20},
		NewBackOff: func() backoff.BackOff { return &backoff.ZeroBackOff{} },
		Log:        zerolog.New(zerolog.NewTestWriter(t)),
	}
	return h
}

func (h *harness) run(t *testing.T) (Outcome, *Agent) {
	t.Helper()
	rdzv := &rendezvous.Static{
		Round:       rendezvous.Round{NumNodes: 1, WorldSize: h.spec.LocalWorkers, MasterAddr: "127.0.0.1", MasterPort: 1},
		MaxFailures: h.spec.MaxRestarts,
	}
	a, err := New(h.spec, rdzv)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := a.Run(ctx)
	require.NoError(t, err)
	return out, a
}

// waitReady waits until n workers printed "ready".
func (h *harness) waitReady(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		return bytes.Count([]byte(h.stdout.String()), []byte("ready")) >= n
	}, 20*time.Second, 10*time.Millisecond)
}

func TestAgentOutcomes(t *testing.T) {
	tests := []struct {
		name     string
		role     string
		restarts int
		exit     int
		rank     int // first failed rank, -1 for none
		signal   string
		errorHas string
		used     int // restarts used
	}{
		{name: "all succeed", role: "ok", exit: 0, rank: -1},
		{name: "one fails", role: "fail:2:3", exit: 3, rank: 2, errorHas: "ValueError: rank 2 broke"},
		{name: "death by signal", role: "signal:1", exit: 128 + 9, rank: 1, signal: "SIGKILL"},
		{name: "error file", role: "errorfile:0", exit: 1, rank: 0, errorHas: "RuntimeError: out of patience"},
		{name: "restarts until it works", role: "flaky:2", restarts: 3, exit: 0, rank: -1, used: 2},
		{name: "restart budget spent", role: "flaky:9", restarts: 2, exit: 5, rank: 0, used: 2},
		// 75 means "checkpointed, requeue" only after gorun passed a signal on.
		{name: "unasked exit 75 restarts", role: "flaky:1:75", restarts: 1, exit: 0, rank: -1, used: 1},
		{name: "unasked exit 75 fails", role: "flaky:9:75", restarts: 0, exit: 75, rank: 0, used: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.role, 3)
			h.spec.MaxRestarts = tc.restarts
			out, a := h.run(t)
			require.Equal(t, tc.exit, out.ExitCode, "report:\n%s", h.report)
			require.Equal(t, tc.used, out.Restarts)
			if tc.rank < 0 {
				require.Equal(t, StateSucceeded, a.State())
				require.Empty(t, out.Failures)
				return
			}
			require.Equal(t, StateFailed, a.State())
			require.NotEmpty(t, out.Failures)
			f := out.Failures[0]
			require.Equal(t, tc.rank, f.Rank)
			require.Equal(t, "box", f.Host)
			require.Equal(t, tc.signal, f.Signal)
			require.Contains(t, f.Error, tc.errorHas)
			require.Contains(t, h.report.String(), fmt.Sprintf("first failed rank %d on box", tc.rank))
		})
	}
}

func TestAgentOutputIsPrefixed(t *testing.T) {
	h := newHarness(t, "ok", 2)
	out, _ := h.run(t)
	require.Equal(t, 0, out.ExitCode)
	require.Contains(t, h.stdout.String(), "[box:0] rank 0 of 2 started\n")
	require.Contains(t, h.stdout.String(), "[box:1] rank 1 of 2 started\n")
}

// Workers share the stdin they are given, as torchrun's share the agent's.
func TestAgentStdin(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	_, err = w.WriteString("hello\n")
	require.NoError(t, err)
	require.NoError(t, w.Close())
	h := newHarness(t, "stdin", 1)
	h.spec.Stdin = r
	out, _ := h.run(t)
	require.Equal(t, 0, out.ExitCode)
	require.Contains(t, h.stdout.String(), "[box:0] got hello\n")
}

// A successful worker's background child is left TermTimeout to finish.
func TestAgentSuccessLeavesChildrenTime(t *testing.T) {
	file := filepath.Join(t.TempDir(), "uploaded")
	h := newHarness(t, "background", 1)
	h.spec.Environ = append(h.spec.Environ, "BG_FILE="+file)
	out, _ := h.run(t)
	require.Equal(t, 0, out.ExitCode)
	require.FileExists(t, file)
}

func TestAgentStopSignal(t *testing.T) {
	h := newHarness(t, "wait", 2)
	go func() {
		h.waitReady(t, 2)
		h.signals <- syscall.SIGTERM
	}()
	out, a := h.run(t)
	require.Equal(t, 128+int(syscall.SIGTERM), out.ExitCode)
	require.Equal(t, syscall.SIGTERM, out.Signal)
	require.Equal(t, StateFailed, a.State())
}

func TestAgentKillsStubbornWorkersAfterGrace(t *testing.T) {
	h := newHarness(t, "stubborn", 2)
	h.spec.TermTimeout = 200 * time.Millisecond
	logs := &testutil.SyncBuffer{}
	h.spec.Log = zerolog.New(zerolog.MultiLevelWriter(zerolog.NewTestWriter(t), logs))
	go func() {
		h.waitReady(t, 2)
		h.signals <- syscall.SIGINT
	}()
	out, _ := h.run(t)
	require.Equal(t, 128+int(syscall.SIGINT), out.ExitCode)
	require.Contains(t, logs.String(), "workers still running after the grace period: SIGKILL",
		"the workers ignore SIGINT: only the SIGKILL after the grace ends them")
}

func TestAgentSecondSignalKillsAtOnce(t *testing.T) {
	h := newHarness(t, "stubborn", 1)
	h.spec.TermTimeout = time.Hour
	go func() {
		h.waitReady(t, 1)
		h.signals <- syscall.SIGTERM
		h.signals <- syscall.SIGTERM
	}()
	out, _ := h.run(t)
	require.Equal(t, 128+int(syscall.SIGTERM), out.ExitCode)
}

func TestAgentPassesUSR1On(t *testing.T) {
	h := newHarness(t, "usr1", 2)
	go func() {
		h.waitReady(t, 2)
		h.signals <- syscall.SIGUSR1
	}()
	out, a := h.run(t)
	require.Equal(t, 0, out.ExitCode, "workers exit 0 on SIGUSR1; the agent keeps running until they do")
	require.Equal(t, StateSucceeded, a.State())
}

func TestAgentWritesLogFiles(t *testing.T) {
	h := newHarness(t, "flaky:1", 2)
	h.spec.MaxRestarts = 1
	h.spec.Logs.Dir = t.TempDir()
	out, _ := h.run(t)
	require.Equal(t, 0, out.ExitCode)
	require.DirExists(t, filepath.Join(h.spec.Logs.Dir, "test", "attempt_0", "1"))
	for _, rank := range []int{0, 1} {
		data, err := os.ReadFile(filepath.Join(h.spec.Logs.Dir, "test", "attempt_1", fmt.Sprint(rank), "stdout.log"))
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("rank %d of 2 started\n", rank), string(data))
	}
}

func TestContract(t *testing.T) {
	s := Spec{RunID: "r", LocalWorkers: 4, Role: "trainer", MaxRestarts: 3, ErrorDir: "/e", WorkerGPUs: [][]string{nil, {"1"}}}
	w := s.Contract(rendezvous.Round{Number: 2, NodeRank: 2, NumNodes: 3, FirstRank: 8, WorldSize: 12, MasterAddr: "m", MasterPort: 9}, 1)
	require.Equal(t, 9, w.Rank)
	require.Equal(t, 12, w.WorldSize)
	require.Equal(t, 4, w.LocalWorldSize)
	require.Equal(t, 2, w.GroupRank)
	require.Equal(t, 3, w.GroupWorldSize)
	require.Equal(t, 2, w.RestartCount)
	require.Equal(t, "/e/attempt_2/9/error.json", w.ErrorFile)
	require.Equal(t, []string{"1"}, w.VisibleGPUs)
	require.NoError(t, w.Validate())
	require.Nil(t, s.Contract(rendezvous.Round{WorldSize: 4, NumNodes: 1}, 3).VisibleGPUs, "no entry: inherited")
}

func TestReadErrorFile(t *testing.T) {
	dir := t.TempDir()
	peer := 3
	tests := []struct {
		name, doc, want string
		lostPeer        *int
	}{
		{"torchrun nested", `{"message": {"message": "ValueError: x", "extraInfo": {"py_callstack": "a\nb", "timestamp": "1"}}}`, "ValueError: x\na\nb", nil},
		{"plain message", `{"message": "boom"}`, "boom", nil},
		{"names a lost peer", `{"message": "comm: allreduce: peer rank 3: connection lost", "lost_peer": 3}`, "comm: allreduce: peer rank 3: connection lost", &peer},
		{"not json", "segfault in foo\n", "segfault in foo", nil},
		{"empty", "", "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			require.NoError(t, os.WriteFile(p, []byte(tc.doc), 0o644))
			got, lost := readErrorFile(p)
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.lostPeer, lost)
		})
	}
	got, _ := readErrorFile(filepath.Join(dir, "missing"))
	require.Equal(t, "", got)
}

// A worker's multi-MiB error file is cut to a size etcd takes, says so and
// where the whole file is; the console table shows a few short lines.
func TestHugeErrorFileIsCut(t *testing.T) {
	p := filepath.Join(t.TempDir(), "error.json")
	line := strings.Repeat("x", 1000) + "\n"
	require.NoError(t, os.WriteFile(p, []byte(`{"message": "`+strings.Repeat("Traceback line\\n", 300000)+`"}`), 0o644))
	msg, _ := readErrorFile(p)
	require.LessOrEqual(t, len(msg), rendezvous.MaxErrorBytes)
	require.Contains(t, msg, "[cut: first ")
	require.Contains(t, msg, p)

	var table bytes.Buffer
	writeFailureTable(&table, []rendezvous.Failure{{Rank: 1, Host: "box", ExitCode: 1, Error: strings.Repeat(line, 50)}}, 0)
	require.Less(t, table.Len(), 2000, "table:\n%s", table.String())
	require.Contains(t, table.String(), "[45 more lines")
	require.Contains(t, table.String(), "[760 more bytes]")
}

func TestAgentHeartbeatTimeout(t *testing.T) {
	tests := []struct {
		role     string
		exit     int
		errorHas string
	}{
		// A Go worker dumps its goroutines on SIGQUIT and exits 2.
		{"beat-then-hang", 2, "no progress for"},
		{"slow-no-beats", 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.role, func(t *testing.T) {
			h := newHarness(t, tc.role, 2)
			h.spec.HeartbeatTimeout = 200 * time.Millisecond
			out, _ := h.run(t)
			require.Equal(t, tc.exit, out.ExitCode, "report:\n%s", h.report)
			if tc.errorHas == "" {
				return
			}
			require.Equal(t, 1, out.Failures[0].Rank)
			require.Contains(t, out.Failures[0].Error, tc.errorHas)
			require.Contains(t, out.Failures[0].Error, "after step 1")
		})
	}
}

func TestAgentRequeue(t *testing.T) {
	h := newHarness(t, "requeue", 3)
	h.spec.MaxRestarts = 5
	go func() {
		h.waitReady(t, 3)
		h.signals <- syscall.SIGUSR1
	}()
	out, _ := h.run(t)
	require.Equal(t, ExitRequeue, out.ExitCode)
	require.True(t, out.Requeue)
	require.Equal(t, 0, out.Restarts, "a requeue spends no restart")
	require.Contains(t, h.report.String(), "requeue the job to resume")
}

// A worker that awaits a new round is not judged hung while it waits;
// when no round comes within AwaitTimeout it is reported as failed, as
// a victim of the peer it lost.
func TestAgentAwaitBound(t *testing.T) {
	h := newHarness(t, "beat-then-await", 2)
	h.spec.InPlace = true
	h.spec.HeartbeatTimeout = time.Second // would fire first if the wait were judged
	h.spec.AwaitTimeout = 3 * time.Second
	out, _ := h.run(t)
	require.Equal(t, 128+int(syscall.SIGTERM), out.ExitCode, "report:\n%s", h.report)
	f := out.Failures[0]
	require.Equal(t, 1, f.Rank)
	require.Contains(t, f.Error, "awaited a new round for 3s after step 1")
	require.NotContains(t, f.Error, "heartbeat timeout")
	require.Equal(t, 0, *f.LostPeer)
}

// An agent that no round took before the job succeeded without it (here:
// the job's one place was taken) exits non-zero and says why, instead of
// exiting 0 as if its workers had done their part.
func TestAgentLeftOutOfASucceededJobFails(t *testing.T) {
	backend := rdzvtest.NewBackend()
	lim := rendezvous.Limits{MinNodes: 1, MaxNodes: 1}
	cfg := func(host string) rendezvous.Config {
		return rendezvous.Config{
			Self:   rendezvous.Member{ID: host + "-id", Host: host, Addr: "127.0.0.1", Preferred: -1, NProc: 1},
			Limits: lim, JoinTimeout: 30 * time.Second,
			FreePort: func(string) (int, error) { return 29500, nil }, Log: zerolog.Nop(),
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	other, err := rendezvous.Join(ctx, backend.Store(), cfg("other"))
	require.NoError(t, err)
	defer other.Close()
	r, err := other.Next(ctx)
	require.NoError(t, err)

	h := newHarness(t, "ok", 1)
	self, err := rendezvous.Join(ctx, backend.Store(), cfg("box"))
	require.NoError(t, err)
	defer self.Close()
	a, err := New(h.spec, self)
	require.NoError(t, err)
	type result struct {
		out Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := a.Run(ctx)
		done <- result{out, err}
	}()
	// Once box waits for a round with room, the other node's job ends.
	for ev := range backend.Store().Watch(ctx, rendezvous.PrefixWait, 0) {
		if !ev.Deleted {
			break
		}
	}
	end, err := other.Succeeded(ctx, r)
	require.NoError(t, err)
	require.True(t, end.Closed)
	got := <-done
	require.NoError(t, got.err)
	require.Equal(t, 1, got.out.ExitCode, "report:\n%s", h.report)
	require.Equal(t, StateFailed, a.State())
	require.Contains(t, h.report.String(), "the job succeeded without node box: no round of the job took it")
}
