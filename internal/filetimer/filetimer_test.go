package filetimer

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// send writes one protocol line to the FIFO as torch's client does.
func send(t *testing.T, path string, pid int, scope string, expires float64, sig int) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer f.Close()
	_, err = fmt.Fprintf(f, `{"version": 1, "pid": %d, "scope_id": %q, "expiration_time": %f, "signal": %d}`+"\n", pid, scope, expires, sig)
	require.NoError(t, err)
}

func TestExpiredTimerKillsItsWorker(t *testing.T) {
	tests := []struct {
		name    string
		release bool
		owned   bool
		killed  bool
	}{
		{"expires", false, true, true},
		{"released", true, true, false},
		{"not ours", false, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			worker := exec.Command("sleep", "30")
			require.NoError(t, worker.Start())
			exited := make(chan error, 1)
			go func() { exited <- worker.Wait() }()
			t.Cleanup(func() { _ = worker.Process.Kill(); <-exited })
			path := filepath.Join(t.TempDir(), "timer")
			srv, err := Serve(context.Background(), path, func(pid int) bool { return tc.owned && pid == worker.Process.Pid })
			require.NoError(t, err)
			defer srv.Close()

			expires := float64(time.Now().Add(200*time.Millisecond).UnixNano()) / 1e9
			send(t, path, worker.Process.Pid, "train_step", expires, int(syscall.SIGKILL))
			if tc.release {
				send(t, path, worker.Process.Pid, "train_step", -1, 0)
			}
			select {
			case err := <-exited:
				exited <- err // for the cleanup
				require.True(t, tc.killed, "worker killed though its timer should not fire")
				e := <-srv.Expired()
				require.Equal(t, "train_step", e.Scope)
			case <-time.After(time.Second):
				require.False(t, tc.killed, "the expired timer did not kill its worker")
			}
		})
	}
}
