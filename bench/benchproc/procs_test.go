package benchproc

import (
	pythonpkg "github.com/gorun/gorun/python"

	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWorkersOf starts a real process tree shaped like an agent's: two workers of run "r1"
// (each with a child of its own, which inherits the run id), a guard-like child without it,
// a worker of another run, and a warm worker of r1 still waiting (a shell named gorun-warm,
// with a child); no command line says "worker". WorkersOf finds exactly the two workers of
// r1, and none under an agent that carries the run id itself.
func TestWorkersOf(t *testing.T) {
	dir := t.TempDir()
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	data, err := os.ReadFile(sh)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(dir+"/"+pythonpkg.WarmComm, data, 0o755))
	// Each leaf writes its pid to a file once it runs, and the test waits for those files:
	// the tree is complete when the last one is there.
	leaf := func(name string) string { return `sh -c 'echo $$ > ` + dir + "/" + name + `; exec sleep 300' & ` }
	script := `TORCHELASTIC_RUN_ID=r1 sh -c "` + strings.ReplaceAll(leaf("w1child"), "'", `\"`) + ` echo \$\$ > ` + dir + `/w1; wait" & ` +
		`TORCHELASTIC_RUN_ID=r1 sh -c "` + strings.ReplaceAll(leaf("w2child"), "'", `\"`) + ` echo \$\$ > ` + dir + `/w2; wait" & ` +
		`TORCHELASTIC_RUN_ID=other sh -c "echo \$\$ > ` + dir + `/o1; exec sleep 300" & ` +
		`TORCHELASTIC_RUN_ID=r1 ` + dir + "/" + pythonpkg.WarmComm + ` -c "` + strings.ReplaceAll(leaf("warmchild"), "'", `\"`) + ` echo \$\$ > ` + dir + `/warm; wait" & ` +
		leaf("guard") + `wait`
	agent := exec.Command("sh", "-c", script)
	agent.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, RunIDEnv+"=") })
	agent.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, agent.Start())
	t.Cleanup(func() {
		_ = syscall.Kill(-agent.Process.Pid, syscall.SIGKILL)
		_ = agent.Wait()
	})
	pids := map[string]int{}
	for _, name := range []string{"w1", "w2", "w1child", "w2child", "o1", "guard", "warm", "warmchild"} {
		pids[name] = awaitPidFile(t, dir+"/"+name)
	}

	got := WorkersOf(agent.Process.Pid, "r1")
	slices.Sort(got)
	want := []int{pids["w1"], pids["w2"]}
	slices.Sort(want)
	require.Equal(t, want, got, "the workers of r1 (every pid: %v)", pids)
	require.Equal(t, []int{pids["o1"]}, WorkersOf(agent.Process.Pid, "other"))
	require.Empty(t, WorkersOf(agent.Process.Pid, "no-such-run"))
	require.Empty(t, WorkersOf(pids["w1"], "r1"), "an agent that carries the run id itself has no workers to tell apart")
}

// awaitPidFile waits for a process of the test tree to write its pid to path (the process
// runs: an event, not a time); it fails after a minute, which only a broken shell reaches.
func awaitPidFile(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if b, err := os.ReadFile(path); err == nil && strings.HasSuffix(string(b), "\n") {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			require.NoError(t, err, "%s", path)
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pid in %s after a minute", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
