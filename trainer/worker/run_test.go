package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/trainer/config"
)

// tinySets make the model tiny, so that 20 steps take well under a
// second of CPU.
var tinySets = []string{
	"model.layers=1", "model.d_model=16", "model.heads=2", "model.context=16",
	"train.global_batch=8", "train.micro_batch=2", "train.steps=20",
	"train.log_every=1", "optim.warmup=5",
}

// tinyConfig writes a small corpus and a train.toml that reads it into a
// fresh directory (checkpoints go to its ckpt/) and loads it with sets
// after tinySets.
func tinyConfig(t testing.TB, sets ...string) config.Config {
	t.Helper()
	dir := t.TempDir()
	var corpus strings.Builder
	for i := range 200 {
		fmt.Fprintf(&corpus, "line %d: the quick brown fox jumps over the lazy dog; func f%d() int { return %d }\n", i, i, i*i)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "corpus.txt"), []byte(corpus.String()), 0o644))
	toml := filepath.Join(dir, "train.toml")
	require.NoError(t, os.WriteFile(toml, []byte("[data]\nfiles = [\"corpus.txt\"]\n\n[train]\nmetrics = \"\"\n"), 0o644))
	cfg, err := config.Load(toml, append(append([]string(nil), tinySets...), sets...))
	require.NoError(t, err)
	return cfg
}

// lines is a Writer safe for concurrent use that tells when a line
// starting with a prefix was written.
type lines struct {
	mu     sync.Mutex
	b      strings.Builder
	prefix string
	seen   chan struct{} // closed at the first line starting with prefix
}

func newLines(prefix string) *lines { return &lines{prefix: prefix, seen: make(chan struct{})} }

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Write(p)
	if l.prefix != "" && (strings.HasPrefix(l.b.String(), l.prefix) || strings.Contains(l.b.String(), "\n"+l.prefix)) {
		l.prefix = ""
		close(l.seen)
	}
	return len(p), nil
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestRunAlone(t *testing.T) {
	dump := filepath.Join(t.TempDir(), "dump")
	metricsPath := filepath.Join(t.TempDir(), "metrics.jsonl")
	stdout, stderr := newLines(""), newLines("")
	err := Run(context.Background(), Options{Config: tinyConfig(t), LookupEnv: envOf("WORLD_SIZE=1"), Threads: 1,
		Metrics: metricsPath, DumpParams: dump, Stdout: stdout, Stderr: stderr})
	require.NoError(t, err)
	require.Contains(t, stdout.String(), "checkpoint: none in ")
	require.Contains(t, stdout.String(), "step 20/20 loss ")
	require.Contains(t, stdout.String(), "trainer: done: 20 steps, last loss ")
	require.Empty(t, stderr.String(), "a world of one needs no job secret")
	b, err := os.ReadFile(metricsPath)
	require.NoError(t, err)
	require.Len(t, strings.Split(strings.TrimSpace(string(b)), "\n"), 20)
	fi, err := os.Stat(filepath.Join(dump, "rank-0.bin"))
	require.NoError(t, err)
	require.Positive(t, fi.Size())
	require.Zero(t, fi.Size()%4)

	// Run again: it resumes from the last step's checkpoint, with nothing left to do.
	stdout = newLines("")
	require.NoError(t, Run(context.Background(), Options{Config: tinyConfig(t), LookupEnv: envOf("WORLD_SIZE=1"), Threads: 1, Stdout: stdout}))
}

func TestRunUsage(t *testing.T) {
	cfg := tinyConfig(t)
	cases := []struct {
		name    string
		env     []string
		threads int
		msg     string
	}{
		{"outside gorun", nil, 0, "worker: not started by gorun or torchrun"},
		{"bad contract", contract(2, "LOCAL_RANK=x"), 0, `worker: distenv: LOCAL_RANK="x" is not an integer`},
		{"hot spare without a channel", []string{"WORLD_SIZE=1", heartbeat.StandbyEnvVar + "=1"}, 0,
			"worker: GORUN_STANDBY=1 needs the agent's channel (GORUN_HEARTBEAT_FD): only gorun starts hot spares"},
		{"bad job secret", []string{"WORLD_SIZE=1", jobsecret.EnvVar + "=short"}, 0, "worker: " + jobsecret.EnvVar + ": "},
		{"negative threads", []string{"WORLD_SIZE=1"}, -1, "worker: Threads = -1: must be 0 (the default) or more"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Run(context.Background(), Options{Config: cfg, LookupEnv: envOf(tc.env...), Threads: tc.threads})
			var xe *ExitError
			require.ErrorAs(t, err, &xe)
			require.Equal(t, ExitUsage, xe.Code)
			require.ErrorContains(t, err, tc.msg)
		})
	}
}

// TestRunStopped: the signals the agent passes on stop a training worker
// with the status the agent reads, a checkpoint first where one is asked,
// and the error file where the agent reads the worker's last words.
func TestRunStopped(t *testing.T) {
	catchSignals(t)
	cases := []struct {
		sig        syscall.Signal
		code       int
		msg        string // in Run's error, after "worker rank 0: "
		saved      bool
		errorFile  string // in the error file's message; "": none written
		parentDone bool   // the caller ends ctx instead of sig
	}{
		{sig: syscall.SIGUSR1, code: ExitRequeue, msg: "(requeue requested); exit 75 asks to be requeued", saved: true, errorFile: "and stopped (requeue requested)"},
		{sig: syscall.SIGUSR2, code: ExitRequeue, msg: "(requeue requested); exit 75 asks to be requeued", saved: true, errorFile: "and stopped (requeue requested)"},
		{sig: syscall.SIGTERM, code: 143, msg: "stopped by terminated: trainer: after step", saved: true, errorFile: "and stopped (terminate requested)"},
		{sig: syscall.SIGINT, code: 130, msg: "stopped by interrupt"},
		{sig: syscall.SIGHUP, code: 129, msg: "stopped by hangup"},
		{code: ExitFailed, msg: "caller gave up", parentDone: true, errorFile: "caller gave up"},
	}
	for _, tc := range cases {
		name := tc.sig.String()
		if tc.parentDone {
			name = "context ends"
		}
		t.Run(name, func(t *testing.T) {
			cfg := tinyConfig(t, "train.steps=1000000", "checkpoint.every=0", "train.log_every=1")
			errorFile := filepath.Join(t.TempDir(), "error.json")
			stdout := newLines("step ")
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			done := make(chan error, 1)
			go func() {
				done <- Run(ctx, Options{Config: cfg, LookupEnv: envOf(contract(1, "TORCHELASTIC_ERROR_FILE="+errorFile)...),
					Threads: 1, Stdout: stdout})
			}()
			select {
			case <-stdout.seen:
			case err := <-done:
				t.Fatalf("Run returned before training: %v", err)
			case <-time.After(time.Minute):
				t.Fatal("no step within a minute")
			}
			if tc.parentDone {
				cancel(errors.New("caller gave up"))
			} else {
				raise(t, tc.sig)
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				t.Fatal("Run did not stop within a minute")
			}
			var xe *ExitError
			require.ErrorAs(t, err, &xe)
			require.Equal(t, tc.code, xe.Code, "%v", err)
			require.True(t, strings.HasPrefix(xe.Error(), "worker rank 0: "), xe.Error())
			require.Contains(t, xe.Error(), tc.msg)

			saved, _ := filepath.Glob(filepath.Join(cfg.Checkpoint.Dir, "step-*"))
			if tc.saved {
				require.Len(t, saved, 1, "one checkpoint, made on request")
				require.Contains(t, stdout.String(), "checkpoint: saved ")
			} else {
				require.Empty(t, saved)
			}
			b, rerr := os.ReadFile(errorFile)
			if tc.errorFile == "" {
				require.ErrorIs(t, rerr, os.ErrNotExist, "a signal that stops at once leaves no last words")
				return
			}
			require.NoError(t, rerr)
			var doc struct{ Message string }
			require.NoError(t, json.Unmarshal(b, &doc))
			require.Contains(t, doc.Message, tc.errorFile)
		})
	}
}

// TestRunHotSpare: a hot spare builds its trainer, tells the agent it is
// ready over a real channel, and trains in the round whose contract the
// agent sends, heartbeating each step.
func TestRunHotSpare(t *testing.T) {
	p, err := heartbeat.NewPipe()
	require.NoError(t, err)
	defer p.Close()
	// The worker's own descriptor, as if inherited; Run's channel owns it
	// (and, as a process's exit would, the garbage collector closes it).
	fd, err := unix.Dup(int(p.WorkerEnd().Fd()))
	require.NoError(t, err)
	require.NoError(t, p.CloseWorkerEnd())
	var mu sync.Mutex
	var steps []int
	p.OnBeat(func(pr heartbeat.Progress) {
		mu.Lock()
		defer mu.Unlock()
		steps = append(steps, pr.Step)
	})

	stdout, stderr := newLines(""), newLines("")
	done := make(chan error, 1)
	go func() {
		done <- Run(context.Background(), Options{Config: tinyConfig(t), Threads: 1, Stdout: stdout, Stderr: stderr,
			LookupEnv: envOf("WORLD_SIZE=1", heartbeat.StandbyEnvVar+"=1", fmt.Sprintf("%s=%d", heartbeat.EnvVar, fd))})
	}()
	select {
	case <-p.Ready():
	case err := <-done:
		t.Fatalf("the hot spare returned before it was ready: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the hot spare was not ready within a minute")
	}
	require.NotContains(t, stdout.String(), "step ", "a hot spare does not train before its round")
	round := distenv.Worker{Rank: 0, LocalRank: 0, WorldSize: 1, LocalWorldSize: 1, GroupWorldSize: 1, RestartCount: 2, RunID: "job"}
	require.NoError(t, p.SendRound(round, false))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("the hot spare did not finish within a minute")
	}
	require.Contains(t, stdout.String(), "trainer: done: 20 steps")
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(steps) > 0 && steps[len(steps)-1] == 20
	}, 10*time.Second, time.Millisecond, "a heartbeat for the last step")
}
