package etcdtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/gorun/gorun/internal/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.GoleakOptions()...) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestStartPutGetClose(t *testing.T) {
	s := etcdtest.Start(t)
	require.Len(t, s.Endpoints(), 1)
	require.Regexp(t, `^http://127\.0\.0\.1:\d+$`, s.Endpoints()[0])
	cli := s.Client(t)
	ctx := ctxT(t)
	_, err := cli.Put(ctx, "k", "v")
	require.NoError(t, err)
	resp, err := cli.Get(ctx, "k")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.Equal(t, "v", string(resp.Kvs[0].Value))

	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "a second Close is safe")
}

func TestClusterSurvivesOneMemberLoss(t *testing.T) {
	members := etcdtest.StartCluster(t, 3)
	var endpoints []string
	for _, m := range members {
		endpoints = append(endpoints, m.Endpoints()...)
	}
	cli := etcdtest.NewClient(t, endpoints...)
	ctx := ctxT(t)
	_, err := cli.Put(ctx, "before", "1")
	require.NoError(t, err)

	require.NoError(t, members[0].Close())

	_, err = cli.Put(ctx, "after", "2")
	require.NoError(t, err)
	resp, err := cli.Get(ctx, "", clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 2)
}

func TestDebianEtcd(t *testing.T) {
	s := etcdtest.StartDebian(t)
	cli := s.Client(t)
	ctx := ctxT(t)
	st, err := cli.Status(ctx, s.Endpoints()[0])
	require.NoError(t, err)
	require.Regexp(t, `^3\.4\.`, st.Version)
	_, err = cli.Put(ctx, "k", "v")
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
}
