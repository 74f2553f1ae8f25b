package etcdstore_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// testTTL is the lease TTL of the stores under test.
const testTTL = 2 * time.Second

// sessionWait bounds each wait for a session change (the changes come a
// lease TTL or so after their cause; this only stops a broken test).
const sessionWait = 30 * time.Second

// awaitSession waits until store's session satisfies ok and returns it.
func awaitSession(t *testing.T, store rendezvous.Store, what string, ok func(rendezvous.Session) bool) rendezvous.Session {
	t.Helper()
	deadline := time.After(sessionWait)
	for {
		sess, changed := store.Session()
		if ok(sess) {
			return sess
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("session never %s: %+v", what, sess)
		}
	}
}

func isDown(s rendezvous.Session) bool { return !s.Live }
func isBack(s rendezvous.Session) bool { return s.Live && s.Outages > 0 }
func leaseOf(t *testing.T, client *clientv3.Client, key string) (clientv3.LeaseID, int64) {
	t.Helper()
	resp, err := client.Get(context.Background(), key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "key %s", key)
	return clientv3.LeaseID(resp.Kvs[0].Lease), resp.Kvs[0].CreateRevision
}

// A lease that etcd expired (revoked by hand here) is replaced: the store
// grants a new one and puts every leased key it holds again, with its
// last value; keys it deleted stay deleted, unleased keys are untouched.
func TestEtcdSessionRenewedAfterExpiry(t *testing.T) {
	eps := etcdtest.Start(t).Endpoints()
	admin := etcdtest.NewClient(t, eps...)
	store, err := etcdstore.NewConn(etcdtest.NewClient(t, eps...)).NewStore(context.Background(), etcdstore.Incarnation{RunID: "job"}, testTTL)
	require.NoError(t, err)
	defer store.Close()
	ctx := context.Background()
	require.NoError(t, store.Put(ctx, "nodes/a", []byte("a1"), true))
	require.NoError(t, store.Put(ctx, "nodes/a", []byte("a2"), true))
	require.NoError(t, store.Put(ctx, "rounds/00000000/join/a", []byte("join"), true))
	require.NoError(t, store.Put(ctx, "waiting/a", []byte("wait"), true))
	require.NoError(t, store.Delete(ctx, "waiting/a"))
	require.NoError(t, store.Put(ctx, "plain", []byte("p"), false))
	old, _ := leaseOf(t, admin, "/gorun/job/0/nodes/a")

	_, err = admin.Revoke(ctx, old)
	require.NoError(t, err)
	awaitSession(t, store, "lost", isDown)
	sess := awaitSession(t, store, "re-established", isBack)
	require.True(t, sess.Renewed, "etcd no longer held the lease: a new one")

	resp, err := admin.Get(ctx, "/gorun/job/0/", clientv3.WithPrefix())
	require.NoError(t, err)
	got := map[string]string{}
	var lease clientv3.LeaseID
	for _, kv := range resp.Kvs {
		got[strings.TrimPrefix(string(kv.Key), "/gorun/job/0/")] = string(kv.Value)
		if string(kv.Key) == "/gorun/job/0/nodes/a" {
			lease = clientv3.LeaseID(kv.Lease)
		}
	}
	require.Equal(t, map[string]string{"nodes/a": "a2", "rounds/00000000/join/a": "join", "plain": "p"}, got)
	require.NotEqual(t, old, lease)
	ttl, err := admin.TimeToLive(ctx, lease, clientv3.WithAttachedKeys())
	require.NoError(t, err)
	require.Positive(t, ttl.TTL)
	require.Len(t, ttl.Keys, 2, "both leased keys are under the new lease")

	// The new lease is kept alive, and Close releases it.
	require.True(t, store.CheckSession(ctx))
	require.NoError(t, store.Close())
	resp, err = admin.Get(ctx, "/gorun/job/0/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "only the unleased key is left")
}

// Keep-alives that go unanswered for the TTL (the way to etcd is frozen)
// while etcd still holds the lease (another client renews it here) lose
// the session, and when etcd answers again the store keeps the lease:
// its keys were never deleted.
func TestEtcdSessionKeepsALeaseEtcdStillHolds(t *testing.T) {
	eps := etcdtest.Start(t).Endpoints()
	admin := etcdtest.NewClient(t, eps...)
	proxy := startProxy(t, strings.TrimPrefix(eps[0], "http://"))
	store, err := etcdstore.NewConn(etcdtest.NewClient(t, proxy.endpoint())).NewStore(context.Background(), etcdstore.Incarnation{RunID: "job"}, testTTL)
	require.NoError(t, err)
	defer store.Close()
	ctx := context.Background()
	require.NoError(t, store.Put(ctx, "nodes/a", []byte("a"), true))
	lease, created := leaseOf(t, admin, "/gorun/job/0/nodes/a")

	proxy.pause()
	renewing, stopRenewing := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { renew(renewing, admin, lease) })
	awaitSession(t, store, "lost", isDown)
	proxy.resume()
	sess := awaitSession(t, store, "re-established", isBack)
	stopRenewing()
	wg.Wait()

	require.False(t, sess.Renewed, "etcd still held the lease: kept")
	now, createdNow := leaseOf(t, admin, "/gorun/job/0/nodes/a")
	require.Equal(t, lease, now)
	require.Equal(t, created, createdNow, "the key was never deleted")
	require.True(t, store.CheckSession(ctx), "keep-alives run again")
}

// renew keeps lease alive from another client until ctx ends.
func renew(ctx context.Context, client *clientv3.Client, lease clientv3.LeaseID) {
	tick := time.NewTicker(testTTL / 4)
	defer tick.Stop()
	for {
		_, _ = client.KeepAliveOnce(ctx, lease)
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// proxy forwards TCP connections to one address on 127.0.0.1 and can
// freeze them: while paused, nothing crosses in either direction, as with
// a stopped etcd or a cut link, but the connections stay open.
type proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu      sync.Mutex
	running chan struct{} // closed while not paused
	conns   []net.Conn
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, target: target, running: make(chan struct{})}
	close(p.running)
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *proxy) endpoint() string { return "http://" + p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(out, in) })
		p.wg.Go(func() { p.pipe(in, out) })
	}
}

// pipe copies src to dst, holding each chunk while the proxy is paused.
func (p *proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			running := p.running
			p.mu.Unlock()
			<-running
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running = make(chan struct{})
}

func (p *proxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.running:
	default:
		close(p.running)
	}
}

func (p *proxy) close() {
	p.resume()
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
