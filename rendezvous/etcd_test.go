package rendezvous_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// The protocol against real etcd (etcdtest.Kinds).

// etcdNode is an agent with a client of its own, so killing it (closing
// the client without revoking) lets its lease expire as a dead node's does.
type etcdNode struct {
	node
	client *clientv3.Client
}

const testTTL = 2 * time.Second

func joinEtcd(t *testing.T, endpoints []string, runID string, cfg rendezvous.Config) *etcdNode {
	t.Helper()
	client := etcdtest.NewClient(t, endpoints...)
	store, err := etcdstore.NewConn(client).NewStore(context.Background(), etcdstore.Incarnation{RunID: runID}, testTTL)
	require.NoError(t, err)
	e, err := rendezvous.Join(context.Background(), store, cfg)
	require.NoError(t, err)
	n := &etcdNode{node: node{rdzv: e, host: cfg.Self.Host}, client: client}
	t.Cleanup(func() { _ = e.Close() })
	return n
}

// kill stops n's keep-alives without revoking its lease: its keys expire
// after the TTL, as a dead node's do.
func (n *etcdNode) kill() { _ = n.client.Close() }

func nextAllEtcd(t *testing.T, nodes ...*etcdNode) []rendezvous.Round {
	t.Helper()
	var plain []*node
	for _, n := range nodes {
		plain = append(plain, &n.node)
	}
	return nextAll(t, plain...)
}

func TestEtcdNodeLossAndScaleUp(t *testing.T) {
	for _, srv := range etcdtest.Kinds() {
		t.Run(srv.Name, func(t *testing.T) {
			eps := srv.Start(t).Endpoints()
			a := joinEtcd(t, eps, "job", config("a", -1, testLimits))
			b := joinEtcd(t, eps, "job", config("b", -1, testLimits))
			c := joinEtcd(t, eps, "job", config("c", -1, testLimits))
			first := nextAllEtcd(t, a, b, c)
			requireConsistent(t, first, 3)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			watchA := a.rdzv.Watch(ctx, first[0])
			watchB := b.rdzv.Watch(ctx, first[1])
			killed := time.Now()
			c.kill()
			for _, w := range []<-chan rendezvous.End{watchA, watchB} {
				select {
				case end := <-w:
					require.Contains(t, end.Reason, "node c")
				case <-time.After(testTTL + 10*time.Second):
					t.Fatal("node loss not noticed")
				}
			}
			t.Logf("node loss noticed after %s (lease TTL %s)", time.Since(killed).Round(time.Millisecond), testTTL)
			second := nextAllEtcd(t, a, b)
			requireConsistent(t, second, 2)
			t.Logf("restarted round formed %s after the kill", time.Since(killed).Round(time.Millisecond))

			watchA = a.rdzv.Watch(ctx, second[0])
			d := joinEtcd(t, eps, "job", config("d", -1, testLimits))
			var dRound rendezvous.Round
			var dErr error
			var wg sync.WaitGroup
			wg.Go(func() { dRound, dErr = d.rdzv.Next(ctx) })
			end := <-watchA
			require.Contains(t, end.Reason, "node d waiting to join")
			third := nextAllEtcd(t, a, b)
			wg.Wait()
			require.NoError(t, dErr)
			requireConsistent(t, append(third, dRound), 3)
			require.Equal(t, 2, third[0].Number)
		})
	}
}

func TestEtcdRunIDsAreApart(t *testing.T) {
	eps := etcdtest.Start(t).Endpoints()
	lim := rendezvous.Limits{MinNodes: 2, MaxNodes: 2, MaxFailures: 1}
	var jobs [2][]*etcdNode
	for j, id := range []string{"job-one", "job-two"} {
		for i := range 2 {
			jobs[j] = append(jobs[j], joinEtcd(t, eps, id, config(fmt.Sprintf("%s-%d", id, i), -1, lim)))
		}
	}
	one := nextAllEtcd(t, jobs[0]...)
	two := nextAllEtcd(t, jobs[1]...)
	requireConsistent(t, one, 2)
	requireConsistent(t, two, 2)

	// A failure in one job leaves the other untouched.
	end, err := jobs[0][0].rdzv.Failed(context.Background(), one[0], []rendezvous.Failure{{Host: "x", Rank: 0, ExitCode: 1, Time: time.Now()}})
	require.NoError(t, err)
	require.False(t, end.Closed)
	failures, err := jobs[1][0].rdzv.Failures(context.Background())
	require.NoError(t, err)
	require.Empty(t, failures)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	select {
	case end := <-jobs[1][0].rdzv.Watch(ctx, two[0]):
		t.Fatalf("job two's round ended: %+v", end)
	case <-ctx.Done():
	}
}

func TestEtcdSurvivesLossOfOneMember(t *testing.T) {
	members := etcdtest.StartCluster(t, 3)
	var eps []string
	for _, m := range members {
		eps = append(eps, m.Endpoints()...)
	}
	lim := rendezvous.Limits{MinNodes: 2, MaxNodes: 2, MaxFailures: 1}
	a := joinEtcd(t, eps, "job", config("a", -1, lim))
	b := joinEtcd(t, eps, "job", config("b", -1, lim))
	rounds := nextAllEtcd(t, a, b)
	require.NoError(t, members[0].Close())
	// The job goes on: a failure opens the next round, which forms.
	_, err := a.rdzv.Failed(context.Background(), rounds[0], []rendezvous.Failure{{Host: "a", Time: time.Now(), ExitCode: 1}})
	require.NoError(t, err)
	rounds = nextAllEtcd(t, a, b)
	requireConsistent(t, rounds, 2)
	require.Equal(t, 1, rounds[0].Number)
}
