package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"
)

// asMain makes the test binary run gorun's main, so process tests need no
// separate build.
const asMain = "GORUNTEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMain) == "1" {
		os.Args = append([]string{"gorun"}, os.Args[1:]...)
		main()
		return
	}
	os.Exit(m.Run())
}

// run runs the app in-process and returns exit code, stdout and stderr.
func run(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	app := NewApp()
	var stdout, stderr bytes.Buffer
	app.Writer, app.ErrWriter = &stdout, &stderr
	code := exitCode(app, runApp(context.Background(), app, append([]string{"gorun"}, args...)))
	return code, stdout.String(), stderr.String()
}

func TestBadInputIsOneLineAndExitTwo(t *testing.T) {
	script := filepath.Join(t.TempDir(), "train.py")
	require.NoError(t, os.WriteFile(script, nil, 0o644))
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"unknown flag", nil, []string{"--bogus", "x"}, "unknown flag --bogus (gorun --help lists the flags)"},
		{"nnodes backwards", nil, []string{"--nnodes=3:2", "--", "true"}, "MIN 3 is larger than MAX 2"},
		{"missing script", nil, []string{"nope.py"}, "script nope.py: no such file or directory"},
		{"no entrypoint", nil, nil, "no entrypoint"},
		{"bad nproc", nil, []string{"--nproc-per-node=many", "--", "true"}, "--nproc-per-node=many"},
		{"bad nproc from env", map[string]string{"PET_NPROC_PER_NODE": "-1"}, []string{"--", "true"}, "--nproc-per-node=-1"},
		{"node id outside the step", map[string]string{"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_NODEID": "2", "SLURM_NNODES": "2", "SLURM_STEP_NODELIST": "n[1-2]"}, []string{"--", "true"}, "SLURM_NODEID"},
		{"malformed job nodelist", map[string]string{"SLURM_JOB_ID": "9", "SLURM_NODEID": "0", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-"}, []string{"--", "true"}, "SLURM_JOB_NODELIST"},
		{"two tasks on a node", map[string]string{"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "2"}, []string{script}, "--ntasks-per-node=1"},
		{"bad log format", nil, []string{"--log-format=xml", "--", "true"}, "--log-format=xml"},
		{"bad hostlist", nil, []string{"hostnames", "n[5-3]"}, "n[5-3]"},
		{"plan with bad input", nil, []string{"plan", "--nnodes=0", "x.py"}, "--nnodes=0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, tc.env, tc.args...)
			require.Equal(t, 2, code, "stderr: %s", stderr)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tc.want)
			require.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
			require.True(t, strings.HasPrefix(stderr, "gorun: "), stderr)
		})
	}
}

func TestUnderscoreSpellingsAndEnv(t *testing.T) {
	code, stdout, _ := run(t, map[string]string{"GORUN_MAX_RESTARTS": "3"}, "plan", "--nproc_per_node=3", "--node_rank=0", "--", "true")
	require.Equal(t, 0, code)
	var plan struct {
		NProc       int                 `json:"nproc_per_node"`
		MaxRestarts int                 `json:"max_restarts"`
		Workers     []map[string]any    `json:"workers"`
		WorkerEnv   [][]string          `json:"worker_env"`
		Rendezvous  map[string]any      `json:"rendezvous"`
		Command     []string            `json:"command"`
		Extra       map[string]struct{} `json:"-"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &plan))
	require.Equal(t, 3, plan.NProc)
	require.Equal(t, 3, plan.MaxRestarts)
	require.Len(t, plan.Workers, 3)
	require.Len(t, plan.WorkerEnv, 3)
	require.Contains(t, plan.WorkerEnv[2], "RANK=2")
	require.Contains(t, plan.WorkerEnv[2], "TORCHELASTIC_MAX_RESTARTS=3")
	require.Equal(t, "static", plan.Rendezvous["backend"])
}

func TestHostnames(t *testing.T) {
	code, stdout, stderr := run(t, nil, "hostnames", "rack[1-2]-n[01-02]", "gpu9")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "rack1-n01\nrack1-n02\nrack2-n01\nrack2-n02\ngpu9\n", stdout)
}

func TestWarnUnknownEnv(t *testing.T) {
	var buf bytes.Buffer
	warnUnknownEnv(zerolog.New(&buf), []string{"GORUN_NPROC_PER_NODE=2", "GORUN_NPROCS=4", "PET_FOO=1", "HOME=/",
		"GORUN_SNAPSHOT_DIR=/dev/shm/x", "GORUN_SNAPSHOT_STEP=3", "GORUN_SNAPSHOT_REASON=r", "GORUN_SNAPSHOT_VERIFIED=1", "GORUN_SNAPSHOTS=false"}, NewApp().Flags)
	require.Contains(t, buf.String(), "GORUN_NPROCS")
	require.NotContains(t, buf.String(), "GORUN_NPROC_PER_NODE")
	require.NotContains(t, buf.String(), "GORUN_SNAPSHOT", "the variables a worker of gorun inherits, and the flag's")
	require.NotContains(t, buf.String(), "PET_FOO")
}

func TestEveryFlagHasBothSpellingsAndEnv(t *testing.T) {
	for _, f := range launchFlags() {
		names := f.Names()
		if strings.Contains(names[0], "-") {
			require.Contains(t, names, strings.ReplaceAll(names[0], "-", "_"))
		}
		envs := f.(interface{ GetEnvVars() []string }).GetEnvVars()
		up := strings.ToUpper(strings.ReplaceAll(names[0], "-", "_"))
		require.Equal(t, []string{"GORUN_" + up, "PET_" + up}, envs[:2], "then torchrun's other names of the same setting")
		require.NotEmpty(t, f.(cli.DocGenerationFlag).GetUsage())
	}
}

// startGorun starts the test binary as gorun with args; its workers are
// shell scripts that fork a grandchild and record both PIDs in dir. Its
// TMPDIR is the test's: a gorun the test kills leaves its error files.
func startGorun(t *testing.T, dir string, args ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), asMain+"=1", "PIDDIR="+dir, "TMPDIR="+t.TempDir())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		killRecorded(dir)
		if t.Failed() {
			t.Logf("gorun output:\n%s", out.String())
		}
	})
	return cmd
}

// workerScript is a worker that forks a sleeping grandchild, records its
// own PID and the grandchild's, and waits.
const workerScript = `sleep 300 & echo $! > "$PIDDIR/grandchild-$RANK"; echo $$ > "$PIDDIR/worker-$RANK"; wait`

func recordedPIDs(t *testing.T, dir string, want int) []int {
	t.Helper()
	var pids []int
	require.Eventually(t, func() bool {
		pids = pids[:0]
		files, _ := filepath.Glob(filepath.Join(dir, "*-*"))
		for _, f := range files {
			data, _ := os.ReadFile(f)
			if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
				pids = append(pids, pid)
			}
		}
		return len(pids) == want
	}, 20*time.Second, 10*time.Millisecond)
	return pids
}

func killRecorded(dir string) {
	files, _ := filepath.Glob(filepath.Join(dir, "*-*"))
	for _, f := range files {
		data, _ := os.ReadFile(f)
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && isSleepOrSh(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// gone reports whether pid has ended (a zombie waiting for init counts).
func gone(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] == 'Z'
}

func isSleepOrSh(pid int) bool {
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	c := strings.TrimSpace(string(comm))
	return err == nil && (c == "sleep" || c == "sh")
}

func requireAllGone(t *testing.T, pids []int) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, pid := range pids {
			if !gone(pid) {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "processes left: %v", pids)
}

func TestStopSignalLeavesNoProcess(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			cmd := startGorun(t, dir, "--nproc-per-node=2", "--term-timeout=5s", "--", "/bin/sh", "-c", workerScript)
			pids := recordedPIDs(t, dir, 4)
			require.NoError(t, cmd.Process.Signal(sig))
			err := cmd.Wait()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit)
			require.Equal(t, 128+int(sig), exit.ExitCode())
			requireAllGone(t, pids)
		})
	}
}

func TestWorkerFailureLeavesNoProcess(t *testing.T) {
	dir := t.TempDir()
	script := workerScript + `; exit 0`
	fail := `if [ "$RANK" = 1 ]; then while [ ! -s "$PIDDIR/grandchild-0" ]; do sleep 0.01; done; sleep 300 & echo $! > "$PIDDIR/grandchild-1"; echo $$ > "$PIDDIR/worker-1"; sleep 0.1; exit 4; fi; ` + script
	cmd := startGorun(t, dir, "--nproc-per-node=2", "--", "/bin/sh", "-c", fail)
	pids := recordedPIDs(t, dir, 4)
	err := cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, 4, exit.ExitCode())
	requireAllGone(t, pids)
}

func TestSIGKILLOfGorunKillsWorkers(t *testing.T) {
	dir := t.TempDir()
	cmd := startGorun(t, dir, "--nproc-per-node=2", "--", "/bin/sh", "-c", workerScript)
	pids := recordedPIDs(t, dir, 4)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	requireAllGone(t, pids) // workers by their parent-death signal, their children by gorun's guard
}
