package etcdstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// A request etcd refuses for good fails at once, however patient the
// store: were it retried, the call would run into ctx instead.
func TestStoreDoesNotRetryARefusedRequest(t *testing.T) {
	eps := etcdtest.Start(t).Endpoints()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := etcdstore.NewConn(etcdtest.NewClient(t, eps...)).NewStore(ctx, etcdstore.Incarnation{RunID: "job"}, testTTL, etcdstore.WithPatience(time.Hour))
	require.NoError(t, err)
	defer store.Close()

	tooLarge := []byte(strings.Repeat("x", 1600<<10)) // over etcd's 1.5 MiB request limit
	err = store.Put(ctx, "nodes/a", tooLarge, false)
	require.ErrorIs(t, err, rpctypes.ErrRequestTooLarge)
	require.ErrorContains(t, err, `rendezvous: put "nodes/a"`)
	require.NoError(t, ctx.Err(), "failed before its context ended")
}
