package launcher

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

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
