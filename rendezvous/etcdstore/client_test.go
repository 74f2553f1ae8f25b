package etcdstore_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/rendezvous/etcdembed"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

func dialCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestClientConfigFromConf(t *testing.T) {
	eps := []string{"10.0.0.1:2379"}
	for _, tc := range []struct {
		name string
		conf map[string]string
		want etcdstore.ClientConfig
		err  string
	}{
		{"empty", nil, etcdstore.ClientConfig{Endpoints: eps}, ""},
		{"all", map[string]string{
			"cacert": "/ca.pem", "cert": "/c.pem", "key": "/k.pem", "user": "u", "password": "p",
			"dial_timeout": "2s", "connect_timeout": "90", "join_timeout": "600", "last_call_timeout": "x",
		}, etcdstore.ClientConfig{
			Endpoints: eps, CACert: "/ca.pem", Cert: "/c.pem", Key: "/k.pem", User: "u", Password: "p",
			DialTimeout: 2 * time.Second, Patience: 90 * time.Second,
		}, ""},
		{"fractional seconds", map[string]string{"dial_timeout": "0.5"}, etcdstore.ClientConfig{Endpoints: eps, DialTimeout: 500 * time.Millisecond}, ""},
		{"bad duration", map[string]string{"connect_timeout": "soon"}, etcdstore.ClientConfig{}, "--rdzv-conf connect_timeout=soon: want a duration like 30s or a number of seconds"},
		{"zero duration", map[string]string{"dial_timeout": "0s"}, etcdstore.ClientConfig{}, "--rdzv-conf dial_timeout=0s: want a positive duration"},
		{"cert without key", map[string]string{"cert": "/c.pem"}, etcdstore.ClientConfig{}, "cert= and key= go together"},
		{"user without password", map[string]string{"user": "u"}, etcdstore.ClientConfig{}, "user= and password= go together"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := etcdstore.ClientConfigFromConf(eps, tc.conf)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	_, err := etcdstore.ClientConfigFromConf([]string{"ftp://x:1"}, nil)
	require.ErrorContains(t, err, `etcd endpoint "ftp://x:1": want host:port, http://host:port or https://host:port`)
	_, err = etcdstore.ClientConfigFromConf(nil, nil)
	require.ErrorContains(t, err, "no etcd endpoint")
}

// A dead endpoint's cause is named however the patience compares with the
// machine's speed: 1ns is spent before the first dial runs, as 300ms can be
// on a busy machine (CI once saw "no answer (timed out)" there).
func TestDialDeadEndpointGivesUpWithTheCause(t *testing.T) {
	for _, patience := range []time.Duration{300 * time.Millisecond, time.Nanosecond} {
		t.Run(patience.String(), func(t *testing.T) {
			// Below the ephemeral range: no connection's source port takes it
			// while the test expects "connection refused" there.
			ports, err := testutil.StablePorts(1, []string{"127.0.0.1"})
			require.NoError(t, err)
			addr := "127.0.0.1:" + strconv.Itoa(ports[0])
			_, err = etcdstore.Dial(dialCtx(t), etcdstore.ClientConfig{Endpoints: []string{addr}, Patience: patience})
			require.EqualError(t, err, "rendezvous: no etcd answered at "+addr+" within "+patience.String()+" (last error: connection refused)")
		})
	}
}

func TestDialStopsWithItsContext(t *testing.T) {
	ports, err := testutil.StablePorts(1, []string{"127.0.0.1"})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = etcdstore.Dial(ctx, etcdstore.ClientConfig{Endpoints: []string{"127.0.0.1:" + strconv.Itoa(ports[0])}})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "rendezvous: dial etcd at 127.0.0.1:")
}

func TestDialWaitsForALateServer(t *testing.T) {
	// Below the ephemeral range: the server binds them 300 ms after the
	// pick, and an ephemeral port may become a connection's source port
	// meanwhile.
	ports, err := testutil.StablePorts(2, []string{"127.0.0.1"})
	require.NoError(t, err)
	cfg := etcdembed.Config{
		Name: "late", DataDir: t.TempDir(), UnsafeNoFsync: true,
		ClientAddr: "127.0.0.1:" + strconv.Itoa(ports[0]), PeerAddr: "127.0.0.1:" + strconv.Itoa(ports[1]),
		Heartbeat: 10 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond,
	}
	started := make(chan *etcdembed.Server, 1)
	startErr := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		s, err := etcdembed.Start(context.Background(), cfg)
		startErr <- err
		started <- s
	}()
	cli, err := etcdstore.Dial(dialCtx(t), etcdstore.ClientConfig{Endpoints: []string{cfg.ClientAddr}, Patience: 20 * time.Second})
	require.NoError(t, <-startErr)
	s := <-started
	defer s.Close()
	require.NoError(t, err)
	defer cli.Close()
	_, err = cli.Put(dialCtx(t), "k", "v")
	require.NoError(t, err)
}

func TestDialEmbeddedPutGet(t *testing.T) {
	s := etcdtest.Start(t)
	cli, err := etcdstore.Dial(dialCtx(t), etcdstore.ClientConfig{Endpoints: s.Endpoints()})
	require.NoError(t, err)
	defer cli.Close()
	_, err = cli.Put(dialCtx(t), "k", "v")
	require.NoError(t, err)
	resp, err := cli.Get(dialCtx(t), "k")
	require.NoError(t, err)
	require.Equal(t, "v", string(resp.Kvs[0].Value))
}

func TestDialTLSFilesMissing(t *testing.T) {
	dir := t.TempDir()
	ca := writeCA(t, dir)
	for _, tc := range []struct {
		name string
		cfg  etcdstore.ClientConfig
		want string
	}{
		{"cacert", etcdstore.ClientConfig{CACert: filepath.Join(dir, "nope.pem")}, "rendezvous: TLS cacert: open " + filepath.Join(dir, "nope.pem") + ": no such file or directory"},
		{"cacert not PEM", etcdstore.ClientConfig{CACert: writeFile(t, dir, "junk.pem", "junk")}, "rendezvous: TLS cacert " + filepath.Join(dir, "junk.pem") + ": no PEM certificate in it"},
		{"cert", etcdstore.ClientConfig{CACert: ca, Cert: filepath.Join(dir, "c.pem"), Key: ca}, "rendezvous: TLS cert: open " + filepath.Join(dir, "c.pem") + ": no such file or directory"},
		{"key", etcdstore.ClientConfig{Cert: ca, Key: filepath.Join(dir, "k.pem")}, "rendezvous: TLS key: open " + filepath.Join(dir, "k.pem") + ": no such file or directory"},
		{"key not a key", etcdstore.ClientConfig{Cert: ca, Key: ca}, "rendezvous: TLS cert=" + ca + " key=" + ca + ": tls:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Endpoints = []string{"127.0.0.1:1"}
			_, err := etcdstore.Dial(dialCtx(t), tc.cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TLS against a plain server: the handshake gets no answer or a hang-up,
// and the error says so.
func TestDialTLSAgainstPlainServer(t *testing.T) {
	s := etcdtest.Start(t)
	ca := writeCA(t, t.TempDir())
	hostport := s.Endpoints()[0][len("http://"):]
	_, err := etcdstore.Dial(dialCtx(t), etcdstore.ClientConfig{Endpoints: []string{hostport}, CACert: ca, Patience: 500 * time.Millisecond})
	require.EqualError(t, err, "rendezvous: no etcd answered at "+hostport+" within 500ms (last error: no TLS handshake (for an etcd without TLS, use http:// endpoints))")
}

func TestDialAuth(t *testing.T) {
	s := etcdtest.Start(t)
	admin := s.Client(t)
	ctx := dialCtx(t)
	_, err := admin.UserAdd(ctx, "root", "secret")
	require.NoError(t, err)
	_, err = admin.UserGrantRole(ctx, "root", "root")
	require.NoError(t, err)
	_, err = admin.AuthEnable(ctx)
	require.NoError(t, err)

	_, err = etcdstore.Dial(ctx, etcdstore.ClientConfig{Endpoints: s.Endpoints(), User: "root", Password: "wrong", Patience: time.Hour})
	require.ErrorContains(t, err, "authentication failed")

	cli, err := etcdstore.Dial(ctx, etcdstore.ClientConfig{Endpoints: s.Endpoints(), User: "root", Password: "secret"})
	require.NoError(t, err)
	defer cli.Close()
	_, err = cli.Put(ctx, "k", "v")
	require.NoError(t, err)
}

// Debian's etcd 3.4 answers our 3.7 client: everything the rendezvous
// uses (Put, Get, Txn, Watch, Lease) works across the versions.
func TestDebianEtcdServesOurClient(t *testing.T) {
	s := etcdtest.StartDebian(t)
	ctx := dialCtx(t)
	cli, err := etcdstore.Dial(ctx, etcdstore.ClientConfig{Endpoints: s.Endpoints()})
	require.NoError(t, err)
	defer cli.Close()

	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	watch := cli.Watch(wctx, "/gorun/", clientv3.WithPrefix())

	put, err := cli.Put(ctx, "/gorun/state", "joinable")
	require.NoError(t, err)
	rev := put.Header.Revision
	txn, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision("/gorun/state"), "=", rev)).
		Then(clientv3.OpPut("/gorun/state", "frozen")).Else(clientv3.OpGet("/gorun/state")).Commit()
	require.NoError(t, err)
	require.True(t, txn.Succeeded)
	stale, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision("/gorun/state"), "=", rev)).
		Then(clientv3.OpPut("/gorun/state", "lost")).Commit()
	require.NoError(t, err)
	require.False(t, stale.Succeeded, "compare-and-swap on a stale revision")
	get, err := cli.Get(ctx, "/gorun/state")
	require.NoError(t, err)
	require.Equal(t, "frozen", string(get.Kvs[0].Value))

	lease, err := cli.Grant(ctx, 5)
	require.NoError(t, err)
	_, err = cli.Put(ctx, "/gorun/member/a", "x", clientv3.WithLease(lease.ID))
	require.NoError(t, err)
	_, err = cli.KeepAliveOnce(ctx, lease.ID)
	require.NoError(t, err)
	_, err = cli.Revoke(ctx, lease.ID)
	require.NoError(t, err)

	var seen []string
	for len(seen) < 4 {
		select {
		case resp := <-watch:
			require.NoError(t, resp.Err())
			for _, ev := range resp.Events {
				seen = append(seen, ev.Type.String()+" "+string(ev.Kv.Key)+" "+string(ev.Kv.Value))
			}
		case <-ctx.Done():
			t.Fatalf("watch saw only %q", seen)
		}
	}
	require.Equal(t, []string{"PUT /gorun/state joinable", "PUT /gorun/state frozen", "PUT /gorun/member/a x", "DELETE /gorun/member/a "}, seen)
}

// writeCA writes a self-signed CA certificate as PEM and returns its path.
func writeCA(t *testing.T, dir string) string {
	ca := newCA(t)
	return writeFile(t, dir, "ca.pem", ca.certPEM)
}

// testCA is a CA that signs test certificates.
type testCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM string
}

func newCA(t *testing.T) testCA {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gorun test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return testCA{cert: cert, key: key, certPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

// issue writes a certificate for 127.0.0.1 signed by ca and its key as
// dir/name.pem and dir/name-key.pem.
func (ca testCA) issue(t *testing.T, dir, name string, serial int64) (certPath, keyPath string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certPath = writeFile(t, dir, name+".pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	keyPath = writeFile(t, dir, name+"-key.pem", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})))
	return certPath, keyPath
}

// An etcd that wants TLS with client certificates: Dial with the right
// files works with a bare host:port endpoint; a CA that did not sign the
// server's certificate fails at once with the reason.
func TestDialTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t)
	caPath := writeFile(t, dir, "ca.pem", ca.certPEM)
	serverCert, serverKey := ca.issue(t, dir, "server", 2)
	clientCert, clientKey := ca.issue(t, dir, "client", 3)

	ports, err := etcdtest.FreePorts(2)
	require.NoError(t, err)
	hostport := "127.0.0.1:" + strconv.Itoa(ports[0])
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir, cfg.UnsafeNoFsync = "tls", t.TempDir(), true
	cfg.TickMs, cfg.ElectionMs = 10, 100
	client := url.URL{Scheme: "https", Host: hostport}
	peer := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(ports[1])}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = "tls=" + peer.String()
	cfg.ClientTLSInfo = transport.TLSInfo{CertFile: serverCert, KeyFile: serverKey, TrustedCAFile: caPath, ClientCertAuth: true}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	require.NoError(t, err)
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(20 * time.Second):
		t.Fatal("TLS etcd not ready")
	}

	cli, err := etcdstore.Dial(dialCtx(t), etcdstore.ClientConfig{
		Endpoints: []string{hostport}, CACert: caPath, Cert: clientCert, Key: clientKey,
	})
	require.NoError(t, err)
	defer cli.Close()
	_, err = cli.Put(dialCtx(t), "k", "v")
	require.NoError(t, err)

	otherCA := writeCA(t, t.TempDir())
	_, err = etcdstore.Dial(dialCtx(t), etcdstore.ClientConfig{
		Endpoints: []string{hostport}, CACert: otherCA, Cert: clientCert, Key: clientKey, Patience: time.Hour,
	})
	require.ErrorContains(t, err, "rendezvous: etcd at "+hostport+": tls: failed to verify certificate: x509: certificate signed by unknown authority")
}

func writeFile(t *testing.T, dir, name, text string) string {
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
	return path
}
