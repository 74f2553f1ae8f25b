package etcdstore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// Unauthenticated is true only for an etcd that answered that it runs
// without authentication: not for one that authenticates, nor when
// there is no answer in time.
func TestConnUnauthenticated(t *testing.T) {
	for _, tc := range []struct {
		name   string
		auth   bool // enable etcd's authentication first
		cancel bool // ask with a context that has ended
		want   bool
	}{
		{"no auth", false, false, true},
		{"auth", true, false, false},
		{"no answer", false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := etcdtest.Start(t).Client(t)
			if tc.auth {
				enableAuth(t, client)
			}
			ctx, cancel := context.WithCancel(context.Background())
			if tc.cancel {
				cancel()
			}
			defer cancel()
			require.Equal(t, tc.want, etcdstore.NewConn(client).Unauthenticated(ctx))
		})
	}
}

// enableAuth turns on etcd's authentication, with the root user it needs.
func enableAuth(t *testing.T, client *clientv3.Client) {
	t.Helper()
	ctx := context.Background()
	_, err := client.UserAdd(ctx, "root", "secret")
	require.NoError(t, err)
	_, err = client.UserGrantRole(ctx, "root", "root")
	require.NoError(t, err)
	_, err = client.AuthEnable(ctx)
	require.NoError(t, err)
}
