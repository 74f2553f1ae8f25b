package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// A node whose start fails half-way is closed part by part: what start
// made is released (the temporary error-file directory, the store's
// lease), what it did not make is skipped, and close reports no error.
func TestNodeCloseAfterFailedStart(t *testing.T) {
	srv := etcdtest.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := ln.Addr().String()
	require.NoError(t, ln.Close())

	for _, tc := range []struct {
		name      string
		endpoint  string
		nodeID    string
		failure   string // start's error
		conn      bool   // start made the connection
		withStore bool   // and the store, whose lease close releases
	}{
		{"dial", refused, "n0", "no etcd answered", false, false},
		// An empty node id fails the join before it writes a key.
		{"join", srv.Endpoints()[0], "", "node id", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("TMPDIR", t.TempDir())
			l := &Launch{
				RunID: "failed-" + tc.name, Host: "localhost", Addr: "127.0.0.1", NProcPerNode: 1,
				Rendezvous: Rendezvous{
					Backend: BackendEtcd, NodeID: tc.nodeID,
					Client: etcdstore.ClientConfig{Endpoints: []string{tc.endpoint}, Patience: time.Second},
					Timing: RendezvousTiming{LeaseTTL: Duration(5 * time.Second), JoinTimeout: Duration(10 * time.Second)},
					Limits: rendezvous.Limits{MinNodes: 1, MaxNodes: 1},
				},
			}
			n := newNode(l, Runtime{Stdout: io.Discard, Stderr: io.Discard, Log: zerolog.Nop()})
			err := n.start(context.Background())
			require.ErrorContains(t, err, tc.failure)
			require.DirExists(t, n.tmpDir)
			require.Equal(t, tc.conn, n.conn != nil)
			require.Equal(t, tc.withStore, n.store != nil)
			require.Nil(t, n.rdzv)
			require.Nil(t, n.agent)

			require.NoError(t, n.close(time.Time{}))
			require.NoDirExists(t, n.tmpDir)
			leases, err := srv.Client(t).Leases(context.Background())
			require.NoError(t, err)
			require.Empty(t, leases.Leases, "the store's lease is released")
		})
	}
}

// A node over etcd runs its agent and closes in order: the agent's
// session lease is released with the rendezvous, and the run's keys go
// under one retention lease of etcdstore.RetentionTTL, whether the job
// closed (the rendezvous retains them) or this agent, the last one, was
// stopped with the job still open (close retains them as it leaves).
func TestNodeRunsAndKeepsTheRunsKeys(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string // the worker's; $READY is a FIFO the test reads
		stop   bool   // stop the node once its worker runs
		exit   int
	}{
		{"succeeded", "exit 0", false, 0},
		{"stopped", `echo ready > "$READY"; exec sleep 600`, true, 128 + int(syscall.SIGTERM)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := etcdtest.Start(t)
			t.Setenv("TMPDIR", t.TempDir())
			ready := filepath.Join(t.TempDir(), "ready")
			require.NoError(t, syscall.Mkfifo(ready, 0o600))
			l := &Launch{
				RunID: "whole", Host: "localhost", Addr: "127.0.0.1", NProcPerNode: 1,
				Command: []string{"/bin/sh", "-c", tc.script}, Environ: []string{"READY=" + ready},
				TermTimeout: Duration(5 * time.Second),
				Rendezvous: Rendezvous{
					Backend: BackendEtcd, NodeID: "n0",
					Client: etcdstore.ClientConfig{Endpoints: srv.Endpoints(), Patience: 10 * time.Second},
					Timing: RendezvousTiming{LeaseTTL: Duration(5 * time.Second), JoinTimeout: Duration(60 * time.Second)},
					Limits: rendezvous.Limits{MinNodes: 1, MaxNodes: 1},
				},
			}
			n := newNode(l, Runtime{Stdout: io.Discard, Stderr: io.Discard, Log: zerolog.Nop()})
			require.NoError(t, n.start(context.Background()))
			ctx, stop := context.WithCancelCause(context.Background())
			defer stop(nil)
			type result struct {
				out elastic.Outcome
				err error
			}
			done := make(chan result, 1)
			go func() {
				out, err := n.run(ctx)
				done <- result{out, err}
			}()
			if tc.stop {
				_, err := os.ReadFile(ready) // returns once the worker wrote and closed it
				require.NoError(t, err)
				stop(errors.New("the test stops the node"))
			}
			res := <-done
			require.NoError(t, res.err)
			require.Equal(t, tc.exit, res.out.ExitCode, "%+v", res.out)
			if tc.stop {
				require.Equal(t, "the test stops the node", res.out.Reason, "the agent is stopped with ctx's cause")
			}
			require.NoError(t, n.close(leaveBy(res.out)))
			require.NoDirExists(t, n.tmpDir)

			client := srv.Client(t)
			leases, err := client.Leases(context.Background())
			require.NoError(t, err)
			require.Len(t, leases.Leases, 1, "the session's lease is released, a retention lease holds the keys")
			ttl, err := client.TimeToLive(context.Background(), leases.Leases[0].ID)
			require.NoError(t, err)
			require.Greater(t, time.Duration(ttl.TTL)*time.Second, etcdstore.RetentionTTL-time.Hour)
		})
	}
}

// A node whose job succeeded closes without error when etcd is gone by
// then: the node hosting the embedded etcd stops it once every node's
// keys are gone, which may come before this node hears that its lease was
// released. The release only spares the others its TTL; close logs it.
func TestNodeClosesAfterItsEtcdStopped(t *testing.T) {
	srv := etcdtest.Start(t)
	t.Setenv("TMPDIR", t.TempDir())
	l := &Launch{
		RunID: "etcd-gone", Host: "localhost", Addr: "127.0.0.1", NProcPerNode: 1,
		Command: []string{"/bin/sh", "-c", "exit 0"}, TermTimeout: Duration(5 * time.Second),
		Rendezvous: Rendezvous{
			Backend: BackendEtcd, NodeID: "n0",
			Client: etcdstore.ClientConfig{Endpoints: srv.Endpoints(), Patience: time.Second},
			Timing: RendezvousTiming{LeaseTTL: Duration(5 * time.Second), JoinTimeout: Duration(60 * time.Second)},
			Limits: rendezvous.Limits{MinNodes: 1, MaxNodes: 1},
		},
	}
	n := newNode(l, Runtime{Stdout: io.Discard, Stderr: io.Discard, Log: zerolog.Nop()})
	require.NoError(t, n.start(context.Background()))
	out, err := n.run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 0, out.ExitCode, "%+v", out)
	require.NoError(t, srv.Close())
	require.NoError(t, n.close(time.Now()), "a lease that cannot be released is no failure of a job that succeeded")
	require.NoDirExists(t, n.tmpDir)
}

// The snapshot directory: made 0700 under the tmpfs, named by run id and
// pid, the gorun package extracted into it, its path and the package's on
// the workers' environment (PYTHONPATH keeps what it had, after it), and
// removed by close; a tmpfs where it cannot be made is an error that says
// what to do.
func TestSnapshotDir(t *testing.T) {
	shm := t.TempDir()
	file := filepath.Join(shm, "not-a-dir")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	for _, tc := range []struct {
		name, shm, pythonPath string
		durable               string // --snapshot-durable
		wantPath              func(dir string) string
		err                   string
	}{
		{name: "no PYTHONPATH", shm: shm, wantPath: func(dir string) string { return dir + "/python" }},
		{name: "PYTHONPATH kept after it", shm: shm, pythonPath: "/a:/b", wantPath: func(dir string) string { return dir + "/python:/a:/b" }},
		{name: "no tmpfs", shm: file, err: "--snapshots=false"},
		{name: "a durable directory, made", shm: shm, durable: filepath.Join(shm, "shared", "snaps"), wantPath: func(dir string) string { return dir + "/python" }},
		{name: "a durable directory that cannot be made", shm: shm, durable: filepath.Join(file, "snaps"), err: "--snapshot-durable " + filepath.Join(file, "snaps")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &Launch{RunID: "snap", Host: "h", SnapshotReplicas: 2}
			var want *elastic.Durable
			if tc.durable != "" {
				l.SnapshotDurable = &DurableSnapshots{Dir: tc.durable, Every: 100, Keep: 2}
				want = &elastic.Durable{Dir: tc.durable, Every: 100, Keep: 2}
			}
			n := newNode(l, Runtime{ShmDir: tc.shm, Log: zerolog.Nop()})
			spec := elastic.Spec{Environ: []string{"HOME=/h"}}
			if tc.pythonPath != "" {
				spec.Environ = append(spec.Environ, "PYTHONPATH="+tc.pythonPath)
			}
			err := n.makeSnapshotDir(&spec)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				require.ErrorContains(t, err, tc.shm)
				require.Empty(t, n.snapDir)
				return
			}
			require.NoError(t, err)
			dir := filepath.Join(tc.shm, fmt.Sprintf("gorun-snap-%d", os.Getpid()))
			require.Equal(t, dir, n.snapDir)
			st, err := os.Stat(dir)
			require.NoError(t, err)
			require.Equal(t, os.FileMode(0o700), st.Mode().Perm())
			require.FileExists(t, filepath.Join(dir, "python", "gorun", "__init__.py"))
			require.Equal(t, []string{"HOME=/h", "GORUN_SNAPSHOT_DIR=" + dir, "GORUN_SNAPSHOT_CRC=" + filepath.Join(dir, "crc.sock"),
				"PYTHONPATH=" + tc.wantPath(dir)}, spec.Environ)
			c, err := net.Dial("unix", filepath.Join(dir, "crc.sock"))
			require.NoError(t, err, "the agent serves its workers' CRCs")
			require.NoError(t, c.Close())
			require.Equal(t, &elastic.Snapshots{Dir: dir, Node: "h", Replicas: 2, Durable: want}, spec.Snapshots)
			if tc.durable != "" {
				require.DirExists(t, tc.durable)
			}
			require.NoError(t, n.close(time.Time{}))
			require.NoDirExists(t, dir)
		})
	}
}

// TestSweepSnapshotDirs: the snapshot directory of a gorun that is gone
// is removed; one of a gorun that runs, this process's own, and
// directories that are not gorun's snapshot directories are left.
func TestSweepSnapshotDirs(t *testing.T) {
	shm := t.TempDir()
	gone := exec.Command("true")
	require.NoError(t, gone.Run()) // its pid is free now (and the kernel does not reuse it at once)
	mk := func(name string, withPackage bool) string {
		dir := filepath.Join(shm, name)
		sub := dir
		if withPackage {
			sub = filepath.Join(dir, "python", "gorun")
		}
		require.NoError(t, os.MkdirAll(sub, 0o700))
		return dir
	}
	dead := mk(fmt.Sprintf("gorun-run-%d", gone.Process.Pid), true)
	alive := mk(fmt.Sprintf("gorun-run-%d", os.Getppid()), true)
	own := mk(fmt.Sprintf("gorun-run-%d", os.Getpid()), true)
	notOurs := mk(fmt.Sprintf("gorun-snapshot-test-%d", gone.Process.Pid), false)
	SweepSnapshotDirs(shm, zerolog.Nop())
	require.NoDirExists(t, dead)
	for _, d := range []string{alive, own, notOurs} {
		require.DirExists(t, d)
	}
}
