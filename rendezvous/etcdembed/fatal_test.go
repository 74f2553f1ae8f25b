package etcdembed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Two members on one data dir, or on one port: the second fails with one
// line naming the directory or the port and what to do; the first is
// untouched (its data dir kept, even when the second would remove its
// own).
func TestServerStartConflicts(t *testing.T) {
	ctx := testCtx(t)
	first := fastServer(t)
	s, err := Start(ctx, first)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })

	tests := []struct {
		name string
		set  func(*Config)
		want string
	}{
		{"same data dir", func(c *Config) { c.DataDir, c.RemoveDataDir = first.DataDir, true },
			"etcd data dir " + first.DataDir + " is in use by another etcd member"},
		{"same client port", func(c *Config) { c.ClientAddr = first.ClientAddr },
			"client port " + first.ClientAddr + " is in use by another process"},
		{"same peer port", func(c *Config) { c.PeerAddr = first.PeerAddr },
			"peer port " + first.PeerAddr + " is in use by another process"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := fastServer(t)
			tc.set(&cfg)
			_, err := Start(ctx, cfg)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "\n", "one line")
			require.DirExists(t, filepath.Join(first.DataDir, "member"), "the first member's data")
		})
	}
}

// A data dir etcd dies on (its WAL is garbage) gives one line of error
// naming the dir, not a panic: the member runs in a child process (what
// the crashed etcd leaves running is the process's to end), whose whole
// output is checked.
func TestServerStartPanicIsError(t *testing.T) {
	if dir := os.Getenv(crashDirEnv); dir != "" {
		cfg := fastServer(t)
		cfg.DataDir = dir
		_, err := Start(context.Background(), cfg)
		fmt.Println("start:", err)
		os.Exit(0) // not through TestMain: the crashed etcd's goroutines linger
	}
	dir := filepath.Join(t.TempDir(), "etcd")
	wal := filepath.Join(dir, "member", "wal")
	require.NoError(t, os.MkdirAll(wal, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(wal, "0000000000000000-0000000000000000.wal"), []byte("not a WAL"), 0o600))
	cmd := exec.Command(os.Args[0], "-test.run=^TestServerStartPanicIsError$", "-test.count=1")
	// TMPDIR: the child exits without its t.Cleanup, so its temporary
	// directories go under one of the parent's.
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir, "TMPDIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "cannot use its data dir "+dir)
	require.NotContains(t, string(out), "goroutine ")
	require.NotContains(t, string(out), "panic:")
	require.Equal(t, 1, strings.Count(string(out), "start:"), "%s", out)
}

// crashDirEnv tells TestServerStartPanicIsError's child its data dir.
const crashDirEnv = "GORUN_TEST_CRASH_DATA_DIR"

// The trap keeps the first Panic or Fatal entry as an error and ends only
// the goroutine that logged it.
func TestFatalTrap(t *testing.T) {
	for _, level := range []zapcore.Level{zapcore.PanicLevel, zapcore.FatalLevel} {
		t.Run(level.String(), func(t *testing.T) {
			trap := newFatalTrap()
			lg := zap.New(zerologCore{}, zap.WithPanicHook(trap), zap.WithFatalHook(trap))
			after := make(chan bool, 1)
			go func() {
				defer func() { after <- false }() // deferred calls run
				if ce := lg.Check(level, "failed to create WAL"); ce != nil {
					ce.Write(zap.String("path", "/x/member/wal"), zap.Error(os.ErrExist))
				}
				after <- true
			}()
			require.False(t, <-after, "the goroutine ended at the entry")
			err := <-trap.c
			require.EqualError(t, err, "failed to create WAL (error=file already exists, path=/x/member/wal)")
		})
	}
}
