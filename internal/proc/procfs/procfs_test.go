package procfs

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// start runs a shell (under the name bin, when set) with the extra environment entry env, in
// a process group of its own, and returns once the shell has run (its environment and
// arguments are in place), on its way to a read of its standard input; it kills and reaps the shell when the test ends.
func start(t *testing.T, bin, env string) *exec.Cmd {
	t.Helper()
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	if bin != "" {
		data, err := os.ReadFile(sh)
		require.NoError(t, err)
		sh = filepath.Join(t.TempDir(), bin)
		require.NoError(t, os.WriteFile(sh, data, 0o755))
	}
	cmd := exec.Command(sh, "-c", "echo ready; read line", "second argument")
	cmd.Env = append(os.Environ(), env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ready\n", line)
	return cmd
}

// waitNoReap blocks until child pid is in the state options asks for (unix.WSTOPPED or
// unix.WEXITED) and leaves it unreaped.
func waitNoReap(t *testing.T, pid, options int) {
	t.Helper()
	var info unix.Siginfo
	require.NoError(t, unix.Waitid(unix.P_PID, pid, &info, options|unix.WNOWAIT, nil))
}

// TestStatRealProcesses reads the stat line of real children in each state gorun tells apart,
// one of them under a command name that holds ')' and spaces.
func TestStatRealProcesses(t *testing.T) {
	tests := []struct {
		name   string
		bin    string
		signal syscall.Signal // sent, then waited for; 0: none
		states string         // the states it may be seen in
		zombie bool
	}{
		{name: "running or sleeping", states: "RS"},
		{name: "parenthesis and spaces in the name", bin: "a) b (c", states: "RS"},
		{name: "stopped", signal: syscall.SIGSTOP, states: "T"},
		{name: "zombie", signal: syscall.SIGKILL, states: "Z", zombie: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := start(t, tt.bin, "PROCFS_TEST=1")
			pid := cmd.Process.Pid
			switch tt.signal {
			case syscall.SIGSTOP:
				require.NoError(t, cmd.Process.Signal(tt.signal))
				waitNoReap(t, pid, unix.WSTOPPED)
			case syscall.SIGKILL:
				require.NoError(t, cmd.Process.Signal(tt.signal))
				waitNoReap(t, pid, unix.WEXITED)
			}
			p, err := Stat(pid)
			require.NoError(t, err)
			require.Contains(t, tt.states, string(p.State))
			comm := "sh"
			if tt.bin != "" {
				comm = tt.bin
			}
			require.Equal(t, Process{PID: pid, Comm: comm, State: p.State, PPID: os.Getpid(), PGRP: pid, Flags: p.Flags}, p)
			require.Equal(t, tt.zombie, p.Zombie())
			require.Equal(t, tt.zombie, p.Exiting(), "PF_EXITING is set from the start of the exit on, and only then")
			threads, err := Threads(pid)
			require.NoError(t, err)
			require.NotEmpty(t, threads)
			for _, th := range threads {
				require.Contains(t, tt.states, string(th.State), "thread %d", th.PID)
			}
		})
	}
}

// TestStatGone is the error for a pid no process has.
func TestStatGone(t *testing.T) {
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	_, err := Stat(cmd.Process.Pid)
	require.ErrorIs(t, err, os.ErrNotExist)
	threads, err := Threads(cmd.Process.Pid)
	require.NoError(t, err)
	require.Empty(t, threads)
}

// TestParseStat covers the lines a real process cannot be made to show.
func TestParseStat(t *testing.T) {
	tests := []struct {
		name string
		line string
		want Process
		err  string
	}{
		{name: "exiting", line: "7 (w) R 1 7 7 0 -1 4194564 0 0", want: Process{PID: 7, Comm: "w", State: 'R', PPID: 1, PGRP: 7, Flags: 4194564}},
		{name: "name of ')' alone", line: "7 ()) ()) S 2 3 3 0 -1 64 0", want: Process{PID: 7, Comm: ")) ()", State: 'S', PPID: 2, PGRP: 3, Flags: 64}},
		{name: "name with spaces", line: "7 (gorun warm) S 2 3 3 0 -1 64 0", want: Process{PID: 7, Comm: "gorun warm", State: 'S', PPID: 2, PGRP: 3, Flags: 64}},
		{name: "no name", line: "7 w S 1 7 7 0 -1 4", err: "no ')'"},
		{name: "short", line: "7 (w) S 1 7", err: "want state"},
		{name: "bad state", line: "7 (w) SS 1 7 7 0 -1 4", err: "want state"},
		{name: "bad ppid", line: "7 (w) S x 7 7 0 -1 4", err: "invalid syntax"},
		{name: "bad flags", line: "7 (w) S 1 7 7 0 -1 -4", err: "invalid syntax"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStat(7, []byte(tt.line))
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
	p, _ := parseStat(7, []byte("7 (w) R 1 7 7 0 -1 4194564 0 0"))
	require.True(t, p.Exiting(), "4194564 has PF_EXITING (4)")
}

// TestEnvironCmdlineScan marks real processes and finds exactly the live marked ones: not an
// unmarked one, not one whose marker only starts the same, not a marked zombie.
func TestEnvironCmdlineScan(t *testing.T) {
	marker := "PROCFS_TEST_MARK=" + strconv.Itoa(os.Getpid()) + "-" + t.Name()
	a := start(t, "", marker)
	b := start(t, "", marker)
	start(t, "", "PROCFS_TEST_MARK=other")
	start(t, "", marker+"x")
	z := start(t, "", marker)
	require.NoError(t, z.Process.Kill())
	waitNoReap(t, z.Process.Pid, unix.WEXITED)

	env, err := Environ(a.Process.Pid)
	require.NoError(t, err)
	require.Contains(t, env, marker)
	args, err := Cmdline(a.Process.Pid)
	require.NoError(t, err)
	require.Equal(t, []string{a.Path, "-c", "echo ready; read line", "second argument"}, args)
	_, err = Environ(z.Process.Pid)
	require.Error(t, err, "a zombie's environment is gone")

	found, err := Scan(marker)
	require.NoError(t, err)
	var pids []int
	for _, p := range found {
		require.Equal(t, os.Getpid(), p.PPID)
		pids = append(pids, p.PID)
	}
	slices.Sort(pids)
	want := []int{a.Process.Pid, b.Process.Pid}
	slices.Sort(want)
	require.Equal(t, want, pids)

	own, err := Namespace(os.Getpid(), "uts")
	require.NoError(t, err)
	require.Regexp(t, `^uts:\[\d+\]$`, own)
	child, err := Namespace(a.Process.Pid, "uts")
	require.NoError(t, err)
	require.Equal(t, own, child, "a child shares its parent's namespaces")
	_, err = Namespace(a.Process.Pid, "no-such-kind")
	require.ErrorIs(t, err, os.ErrNotExist)

	all, err := PIDs()
	require.NoError(t, err)
	require.Subset(t, all, []int{os.Getpid(), a.Process.Pid, b.Process.Pid, z.Process.Pid})
}
