package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/gorun/gorun/internal/testutil"
)

// Timings of the test servers: fast elections, bounded waits.
const (
	tickMs       = 10
	electionMs   = 100
	readyTimeout = 20 * time.Second // a loaded shared machine is slow to start a cluster
	startTries   = 5                // fresh ports after "address already in use"
	dialTimeout  = 5 * time.Second
)

// Kind is one kind of etcd server that tests run against.
type Kind struct {
	Name  string
	Start func(testing.TB) *Server
}

// Kinds are the etcd servers the rendezvous is tested against: the
// embedded server of our own etcd version, and Debian's etcd-server
// (3.4).
func Kinds() []Kind { return []Kind{{"embedded", Start}, {"debian", StartDebian}} }

// Server is one etcd member run for a test: embedded, or Debian's binary.
type Server struct {
	name      string
	endpoints []string
	stop      func() error

	closeOnce sync.Once
	closeErr  error
}

// Endpoints returns the client URLs, e.g. http://127.0.0.1:41234.
func (s *Server) Endpoints() []string { return append([]string(nil), s.endpoints...) }

// Client returns a client of this server alone with etcd's logs silenced,
// closed in t's cleanup (before the server stops). It fails t if the
// client cannot be built.
func (s *Server) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	return NewClient(t, s.endpoints...)
}

// Close stops the server and waits until it has stopped. It is safe to
// call more than once (tests kill members mid-test; cleanup calls it
// again); later calls return the first call's result.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.stop() })
	return s.closeErr
}

// NewClient returns a client of endpoints with etcd's logs silenced,
// closed in t's cleanup. It fails t if the client cannot be built.
func NewClient(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: dialTimeout, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcdtest: client of %v: %v", endpoints, err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Start runs an embedded etcd member on 127.0.0.1 with ports chosen by
// the kernel, TickMs=10, ElectionMs=100, UnsafeNoFsync and a t.TempDir()
// data dir, and returns once it serves. It is closed in t's cleanup.
// It fails t if no member could start.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartCluster(t, 1)[0]
}

// StartCluster starts n embedded members on 127.0.0.1 forming one new
// cluster, as Start does for one, and returns once every member serves.
// Closing one of three leaves a working quorum. It fails t if the cluster
// could not start.
func StartCluster(t testing.TB, n int) []*Server {
	t.Helper()
	if n < 1 {
		t.Fatalf("etcdtest: StartCluster(%d): want at least one member", n)
	}
	var lastErr error
	for try := 0; try < startTries; try++ {
		servers, err := startCluster(t, n)
		if err == nil {
			for _, s := range servers {
				t.Cleanup(func() { _ = s.Close() })
			}
			return servers
		}
		lastErr = err
		if !isAddrInUse(err) {
			break
		}
	}
	t.Fatalf("etcdtest: start %d embedded etcd members: %v", n, lastErr)
	return nil
}

func startCluster(t testing.TB, n int) ([]*Server, error) {
	ports, err := FreePorts(2 * n)
	if err != nil {
		return nil, err
	}
	cfgs := make([]*embed.Config, n)
	var cluster []string
	for i := range cfgs {
		name := "m" + strconv.Itoa(i)
		client := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2*i]))}
		peer := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2*i+1]))}
		c := embed.NewConfig()
		c.Name = name
		c.Dir = t.TempDir()
		c.ListenClientUrls, c.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
		c.ListenPeerUrls, c.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
		c.TickMs, c.ElectionMs = tickMs, electionMs
		c.UnsafeNoFsync = true
		c.EnableGRPCGateway = false
		c.SnapshotCount = 10000
		c.Logger = "zap"
		c.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		cfgs[i] = c
		cluster = append(cluster, name+"="+peer.String())
	}
	var started []*embed.Etcd
	stopAll := func() {
		for _, e := range started {
			select {
			case <-e.Server.ReadyNotify():
			default:
				e.Server.HardStop() // embed.Close waits forever for an unready member's client servers
			}
			e.Close()
		}
	}
	for _, c := range cfgs {
		c.InitialCluster = strings.Join(cluster, ",")
		c.InitialClusterToken = fmt.Sprintf("etcdtest-%d", ports[0])
		e, err := embed.StartEtcd(c)
		if err != nil {
			stopAll()
			return nil, fmt.Errorf("member %s: %w", c.Name, err)
		}
		started = append(started, e)
	}
	deadline := time.NewTimer(readyTimeout)
	defer deadline.Stop()
	for _, e := range started {
		select {
		case <-e.Server.ReadyNotify():
		case err := <-e.Err():
			stopAll()
			return nil, fmt.Errorf("member %s: %w", e.Config().Name, err)
		case <-deadline.C:
			stopAll()
			return nil, fmt.Errorf("members not ready within %s", readyTimeout)
		}
	}
	servers := make([]*Server, n)
	for i, e := range started {
		servers[i] = &Server{
			name:      cfgs[i].Name,
			endpoints: []string{cfgs[i].AdvertiseClientUrls[0].String()},
			stop:      func() error { e.Close(); return nil },
		}
	}
	return servers, nil
}

// GoleakOptions are the goleak options for tests that run etcd clusters:
// a closed multi-member etcd leaves a few idle peer HTTP connections
// behind (etcd's peer listener hangs in net/http's abortPendingRead under
// cmux, and the other side stays in a transport's idle pool), which
// goleak would report. Single members leave nothing.
func GoleakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).abortPendingRead"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/client/pkg/v3/transport.timeoutConn.Read"),
	}
}

// FreePorts returns n distinct TCP ports of 127.0.0.1 that were free a
// moment ago, as testutil.FreePorts does (another process may take one
// before the caller binds it: retry on "address already in use").
func FreePorts(n int) ([]int, error) {
	return testutil.FreePorts(n)
}

func isAddrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

// waitServing polls until etcd at endpoint answers a Status call, or
// fails after timeout or when exited is closed.
func waitServing(endpoint string, timeout time.Duration, exited <-chan struct{}) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	var last error
	for {
		attempt, stop := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := cli.Status(attempt, endpoint)
		stop()
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-exited:
			return errors.New("etcd exited")
		case <-ctx.Done():
			return fmt.Errorf("no answer within %s: %w", timeout, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
