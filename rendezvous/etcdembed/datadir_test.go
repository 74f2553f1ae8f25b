package etcdembed

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// claimEnv makes TestClaimDataDirProcess claim a data dir under its value.
const claimEnv = "GORUN_TEST_CLAIM_SCRATCH"

// TestClaimDataDirProcess is not a test: it is the body of the child
// process TestClaimDataDirSweepsAbandoned kills, which claims a data dir,
// prints its path and waits to be killed.
func TestClaimDataDirProcess(t *testing.T) {
	scratch := os.Getenv(claimEnv)
	if scratch == "" {
		t.Skip("runs only as a child of TestClaimDataDirSweepsAbandoned")
	}
	d, err := ClaimDataDir(scratch, "child")
	if err != nil {
		os.Stdout.WriteString("claim: " + err.Error() + "\n")
		os.Exit(1)
	}
	require.NoError(t, os.MkdirAll(d.Path(), 0o700))
	os.Stdout.WriteString(d.Path() + "\n")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	os.Exit(0)
}

func TestClaimDataDir(t *testing.T) {
	scratch := filepath.Join(t.TempDir(), "made") // created by the claim
	a, err := ClaimDataDir(scratch, "77-node1")
	require.NoError(t, err)
	b, err := ClaimDataDir(scratch, "77-node1")
	require.NoError(t, err)
	require.NotEqual(t, a.Path(), b.Path(), "two members of one name never share a data dir")
	for _, d := range []*DataDir{a, b} {
		require.True(t, strings.HasPrefix(filepath.Base(filepath.Dir(d.Path())), DataDirPrefix+"77-node1-"), d.Path())
		require.NoError(t, os.MkdirAll(filepath.Join(d.Path(), "member"), 0o700))
	}
	require.NoError(t, a.Release())
	require.NoError(t, a.Release(), "a second Release does nothing")
	require.NoDirExists(t, filepath.Dir(a.Path()))
	require.DirExists(t, b.Path())
	require.NoError(t, b.Release())
	entries, err := os.ReadDir(scratch)
	require.NoError(t, err)
	require.Empty(t, entries)
}

// A member SIGKILLed (srun's stop, a node crash with a persistent
// scratch) leaves its data dir; the next claim under the same scratch
// removes it, and only it: a live member's dir, a dir without gorun's
// lock and other files stay.
func TestClaimDataDirSweepsAbandoned(t *testing.T) {
	scratch := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestClaimDataDirProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), claimEnv+"="+scratch)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "child said %q", line)
	abandoned := strings.TrimSpace(line)
	require.DirExists(t, abandoned)

	live, err := ClaimDataDir(scratch, "live")
	require.NoError(t, err)
	t.Cleanup(func() { _ = live.Release() })
	require.NoError(t, os.MkdirAll(live.Path(), 0o700))
	foreign := filepath.Join(scratch, DataDirPrefix+"no-lock")
	require.NoError(t, os.MkdirAll(foreign, 0o700))
	other := filepath.Join(scratch, "other")
	require.NoError(t, os.MkdirAll(other, 0o700))

	// While its owner lives, the child's dir stays.
	d, err := ClaimDataDir(scratch, "next")
	require.NoError(t, err)
	require.NoError(t, d.Release())
	require.DirExists(t, abandoned)

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	require.DirExists(t, abandoned, "a killed member leaves its dir")

	d, err = ClaimDataDir(scratch, "next")
	require.NoError(t, err)
	require.NoError(t, d.Release())
	require.NoDirExists(t, filepath.Dir(abandoned))
	require.DirExists(t, live.Path())
	require.DirExists(t, foreign)
	require.DirExists(t, other)
}
