package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRecords: the job's final line of steps, polled while it is written.
func TestRecords(t *testing.T) {
	line := func(step, round int) string {
		return `{"step":` + itoa(step) + `,"time":1.5,"loss":2,"lr":0.1,"tokens_per_s":1,"world_size":2,"rank":0,"round":` + itoa(round) + "}\n"
	}
	tests := []struct {
		name    string
		content *string // nil: no file
		steps   []int
		err     string
	}{
		{name: "no file yet"},
		{name: "empty", content: ptr(""), steps: nil},
		{name: "torn last line", content: ptr(line(1, 0) + line(2, 0) + `{"step":3,"ti`), steps: []int{1, 2}},
		{name: "steps redone by a later world", content: ptr(line(1, 0) + line(2, 0) + line(3, 0) + line(2, 1) + line(3, 1) + line(4, 1)), steps: []int{1, 2, 3, 4}},
		{name: "not a record", content: ptr(line(1, 0) + "hello\n" + line(2, 0)), err: ":2:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "metrics.jsonl")
			if tt.content != nil {
				require.NoError(t, os.WriteFile(path, []byte(*tt.content), 0o644))
			}
			recs, err := Records(path)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			var steps []int
			for _, r := range recs {
				steps = append(steps, r.Step)
			}
			require.Equal(t, tt.steps, steps)
		})
	}
	recs, err := Records(writeTemp(t, line(1, 0)+line(2, 0)+line(2, 1)))
	require.NoError(t, err)
	require.Equal(t, 1, recs[1].Round, "a redone step's record is the later world's")
}

// TestTail cuts to the last n lines and says how many it left out.
func TestTail(t *testing.T) {
	tests := []struct{ in, want string }{
		{in: "", want: ""},
		{in: "a\nb\n", want: "a\nb\n"},
		{in: "a\nb\nc\nd", want: "... (2 lines omitted)\nc\nd"},
		{in: "a\nb\nc\n\n", want: "... (2 lines omitted)\nc\n\n"},
		{in: "a\nb\nc\n", want: "... (1 lines omitted)\nb\nc\n"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, Tail(tt.in, 2), "%q", tt.in)
	}
}

// TestMarkedAndStopped finds a real marked process with its environment and command line,
// and sees it stopped once its SIGSTOP took effect.
func TestMarkedAndStopped(t *testing.T) {
	marker := "HARNESS_TEST_MARK=" + t.Name() + itoa(os.Getpid())
	cmd := exec.Command("sleep", "300")
	cmd.Env = append(os.Environ(), marker, "RANK=3")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	require.False(t, Stopped(cmd.Process.Pid), "a process that was not stopped")

	var got []Proc
	for len(got) == 0 { // the marker is in place once exec has set up the new image
		got = Marked(marker)
		time.Sleep(time.Millisecond)
	}
	require.Len(t, got, 1)
	require.Equal(t, cmd.Process.Pid, got[0].PID)
	require.Equal(t, os.Getpid(), got[0].PPID)
	rank, ok := got[0].Getenv("RANK")
	require.True(t, ok)
	require.Equal(t, "3", rank)
	_, ok = got[0].Getenv("NO_SUCH_VARIABLE_HERE")
	require.False(t, ok)
	require.Equal(t, itoa(cmd.Process.Pid)+" sleep 300", got[0].String())

	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	for !Stopped(cmd.Process.Pid) { // the signal is queued; it takes effect soon after
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, cmd.Process.Kill())
	_, _ = cmd.Process.Wait()
	require.Empty(t, Marked(marker), "an ended process is not live")
}

func ptr(s string) *string { return &s }

func itoa(i int) string { return strconv.Itoa(i) }

func writeTemp(t *testing.T, content string) string {
	path := filepath.Join(t.TempDir(), "m.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
	return path
}

// LastStep reads rank 0's step lines of the snapshot example, prefixed
// or not, and nothing else.
func TestLastStep(t *testing.T) {
	for _, tc := range []struct {
		name, output string
		want         int
	}{
		{"no step yet", "gorun: starting\n", -1},
		{"the newest", "step 3 loss 0.5\nstep 4 loss 0.4\n", 4},
		{"prefixed by gorun", "[node1:0] step 41 loss 0.29\n[node1:0] step 42 loss 0.3\n", 42},
		{"a restore is no step", "restored step 40\nstep 41 loss 0.3\n", 41},
		{"a step redone after a restore", "step 42 loss 0.3\nrestored step 40\nstep 41 loss 0.3\n", 42},
	} {
		t.Run(tc.name, func(t *testing.T) { require.Equal(t, tc.want, LastStep(tc.output)) })
	}
}
