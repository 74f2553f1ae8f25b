package filetimer

import (
	"bytes"
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

// A line far over the protocol's size, or garbage, is skipped: the server
// goes on serving the next line (it used to stop for good).
func TestLongOrGarbageLinesAreSkipped(t *testing.T) {
	worker := exec.Command("sleep", "30")
	require.NoError(t, worker.Start())
	exited := make(chan error, 1)
	go func() { exited <- worker.Wait() }()
	t.Cleanup(func() { _ = worker.Process.Kill(); <-exited })
	path := filepath.Join(t.TempDir(), "timer")
	srv, err := Serve(context.Background(), path, func(pid int) bool { return pid == worker.Process.Pid })
	require.NoError(t, err)
	defer srv.Close()

	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.Write(append(bytes.Repeat([]byte("x"), 1<<20), '\n'))
	require.NoError(t, err)
	_, err = f.Write([]byte("not json\n{\"pid\": \n"))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	send(t, path, worker.Process.Pid, "after_garbage", float64(time.Now().UnixNano())/1e9, int(syscall.SIGKILL))
	e := <-srv.Expired()
	require.Equal(t, "after_garbage", e.Scope)
	<-exited
	exited <- nil // for the cleanup
}

// Close may be called twice, concurrently: one closes, both return.
func TestCloseTwice(t *testing.T) {
	srv, err := Serve(context.Background(), filepath.Join(t.TempDir(), "timer"), func(int) bool { return false })
	require.NoError(t, err)
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- srv.Close() }()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
}
