package proc_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/proc"
)

// A worker reads the stdin it is given (torchrun's workers share the
// agent's), in a session of its own; without one it reads /dev/null.
func TestStdin(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	_, err = w.WriteString("hello\n")
	require.NoError(t, err)
	require.NoError(t, w.Close())
	for _, tt := range []struct {
		name  string
		stdin *os.File
		want  string
	}{
		{"shared", r, "got:hello|sid=true\n"},
		{"none", nil, "got:|sid=true\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out := newRecorder()
			spec := worker("read-stdin", "", "")
			spec.Stdin, spec.Stdout = tt.stdin, out
			p := start(t, spec)
			require.Equal(t, 0, wait(t, p).ExitCode)
			assert.Equal(t, tt.want, out.String())
		})
	}
}

// zombie waits, within the deadline, until pid has ended but is not reaped.
func zombie(t *testing.T, pid int) {
	t.Helper()
	requireGone(t, pid) // alive() counts a zombie as dead
}

// A successful leader's background children may finish their work within
// Linger; a failed leader's are killed at once, and Stop reaches them
// while they linger.
func TestLinger(t *testing.T) {
	t.Run("children finish", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "child")
		spec := worker("fork", "await", file)
		spec.Linger = deadline
		p := start(t, spec)
		child := readPID(t, file)
		zombie(t, p.PID())
		require.True(t, alive(child), "the child outlives its leader")
		require.NoError(t, os.WriteFile(file+".go", nil, 0o644))
		assert.Equal(t, 0, wait(t, p).ExitCode)
		assert.FileExists(t, file+".done", "the child did its work")
		requireGone(t, child)
	})
	t.Run("linger over", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "child")
		spec := worker("fork", "exit", file)
		spec.Linger = 1 // ns: over at once
		p := start(t, spec)
		child := readPID(t, file)
		assert.Equal(t, 0, wait(t, p).ExitCode)
		requireGone(t, child)
	})
	t.Run("stopped while lingering", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "child")
		spec := worker("fork", "exit", file)
		spec.Linger = 10 * deadline
		p := start(t, spec)
		child := readPID(t, file)
		zombie(t, p.PID())
		require.True(t, alive(child))
		assert.Equal(t, 0, p.Stop(syscall.SIGTERM, deadline).ExitCode, "the leader's own status")
		requireGone(t, child)
	})
	t.Run("failed leader", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "child")
		spec := worker("fork", "await", file)
		spec.Linger = 10 * deadline
		spec.Path = "/bin/sh"
		spec.Args = []string{"-c", `"$0"; exit 3`, self()}
		p := start(t, spec)
		child := readPID(t, file)
		assert.Equal(t, 3, wait(t, p).ExitCode)
		requireGone(t, child)
	})
}

// A process starts with the CPU affinity it is given.
func TestCPUs(t *testing.T) {
	mine, err := proc.CPUsOf(0)
	require.NoError(t, err)
	require.NotEmpty(t, mine)
	want := []int{mine[len(mine)-1]}
	spec := worker("sleep", "", "")
	spec.CPUs = want
	p := start(t, spec)
	got, err := proc.CPUsOf(p.PID())
	require.NoError(t, err)
	assert.Equal(t, want, got)

	spec.CPUs = []int{-1}
	_, err = proc.Start(spec)
	assert.ErrorContains(t, err, "CPU -1 out of range")
}
