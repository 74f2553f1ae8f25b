package etcdstore

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
)

// Defaults of ClientConfig.
const (
	DefaultDialTimeout = 5 * time.Second
	DefaultPatience    = 30 * time.Second
)

// How the client finds a connection dead and makes a new one: see Dial.
const (
	keepAliveTime     = 10 * time.Second // gRPC's least: pings on an idle connection
	reconnectTimeout  = 2 * time.Second  // unacknowledged data, or a connect attempt, for this long: a new connection
	reconnectMaxDelay = time.Second      // the most time between two connect attempts
)

// Keys of --rdzv-conf that ClientConfigFromConf reads.
const (
	ConfCACert         = "cacert"          // PEM file of the CAs that sign etcd's certificate
	ConfCert           = "cert"            // PEM client certificate (with key)
	ConfKey            = "key"             // PEM key of cert
	ConfUser           = "user"            // etcd user (with password)
	ConfPassword       = "password"        // password of user
	ConfDialTimeout    = "dial_timeout"    // per attempt: a duration ("5s") or seconds ("5")
	ConfConnectTimeout = "connect_timeout" // total patience until etcd answers: a duration or seconds
)

// ClientConfig says how to reach etcd.
type ClientConfig struct {
	// Endpoints are etcd's client addresses: host:port, http://host:port
	// or https://host:port. Without a scheme, TLS is used when CACert or
	// Cert is set.
	Endpoints []string
	// CACert, Cert and Key are PEM files for TLS (from --rdzv-conf
	// cacert=,cert=,key=). CACert alone verifies the server; Cert and Key
	// go together and authenticate the client.
	CACert, Cert, Key string
	// TLS, when set, is used in place of the files CACert, Cert and Key:
	// a job secret's TLS (etcdembed.ClientTLS), made in memory.
	TLS *tls.Config
	// TLSIfOffered makes TLS conditional for endpoints without a scheme:
	// Dial uses it when the endpoint it reaches completes a TLS handshake,
	// and speaks plain HTTP when it answers otherwise (an etcd that
	// gorun does not run, which knows nothing of the job secret). An
	// https:// endpoint always gets TLS, an http:// one never.
	TLSIfOffered bool
	// User and Password authenticate to etcd (from --rdzv-conf
	// user=,password=); both or neither.
	User, Password string
	// DialTimeout bounds one attempt to reach an endpoint (0: 5 s).
	DialTimeout time.Duration
	// Patience bounds the whole wait, retrying with backoff, until an
	// endpoint answers (0: 30 s).
	Patience time.Duration
}

// ClientConfigFromConf returns the ClientConfig for endpoints with the
// --rdzv-conf keys it knows (the Conf* constants) taken from conf. Other
// keys are left to the caller to validate. Durations are Go durations
// ("1m30s") or seconds ("90"); a bad one is an error naming its key, as
// is a user without a password or a cert without a key.
func ClientConfigFromConf(endpoints []string, conf map[string]string) (ClientConfig, error) {
	cfg := ClientConfig{
		Endpoints: endpoints,
		CACert:    conf[ConfCACert], Cert: conf[ConfCert], Key: conf[ConfKey],
		User: conf[ConfUser], Password: conf[ConfPassword],
	}
	for key, dst := range map[string]*time.Duration{ConfDialTimeout: &cfg.DialTimeout, ConfConnectTimeout: &cfg.Patience} {
		v, ok := conf[key]
		if !ok {
			continue
		}
		d, err := parseSeconds(v)
		if err != nil {
			return ClientConfig{}, fmt.Errorf("rendezvous: --rdzv-conf %s=%s: %w", key, v, err)
		}
		*dst = d
	}
	if err := cfg.Validate(); err != nil {
		return ClientConfig{}, err
	}
	return cfg, nil
}

// parseSeconds reads a positive duration: "30s", "1m", or "30" seconds.
func parseSeconds(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		secs, ferr := strconv.ParseFloat(v, 64)
		if ferr != nil {
			return 0, errors.New("want a duration like 30s or a number of seconds")
		}
		d = time.Duration(secs * float64(time.Second))
	}
	if d <= 0 {
		return 0, errors.New("want a positive duration")
	}
	return d, nil
}

// Validate reports the first problem of c that needs no file or network.
func (c ClientConfig) Validate() error {
	if len(c.Endpoints) == 0 {
		return errors.New("rendezvous: no etcd endpoint")
	}
	for _, ep := range c.Endpoints {
		if _, err := endpointHostPort(ep); err != nil {
			return err
		}
	}
	if (c.Cert == "") != (c.Key == "") {
		return fmt.Errorf("rendezvous: --rdzv-conf %s= and %s= go together (got only one)", ConfCert, ConfKey)
	}
	if (c.User == "") != (c.Password == "") {
		return fmt.Errorf("rendezvous: --rdzv-conf %s= and %s= go together (got only one)", ConfUser, ConfPassword)
	}
	if c.DialTimeout < 0 || c.Patience < 0 {
		return errors.New("rendezvous: negative dial timeout or patience")
	}
	return nil
}

// endpointHostPort returns the host:port of an endpoint with or without
// a scheme.
func endpointHostPort(ep string) (string, error) {
	hostport := ep
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return "", fmt.Errorf("rendezvous: etcd endpoint %q: want host:port, http://host:port or https://host:port", ep)
		}
		hostport = u.Host
	}
	if _, port, err := net.SplitHostPort(hostport); err != nil || port == "" {
		return "", fmt.Errorf("rendezvous: etcd endpoint %q: want host:port, http://host:port or https://host:port", ep)
	}
	return hostport, nil
}

// tlsConfig loads the TLS files of c, or gives c.TLS; nil when c uses
// none.
func (c ClientConfig) tlsConfig() (*tls.Config, error) {
	if c.TLS != nil {
		return c.TLS.Clone(), nil
	}
	if c.CACert == "" && c.Cert == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CACert != "" {
		pem, err := os.ReadFile(c.CACert)
		if err != nil {
			return nil, fmt.Errorf("rendezvous: TLS %s: %w", ConfCACert, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("rendezvous: TLS %s %s: no PEM certificate in it", ConfCACert, c.CACert)
		}
		cfg.RootCAs = pool
	}
	if c.Cert != "" {
		certPEM, err := os.ReadFile(c.Cert)
		if err != nil {
			return nil, fmt.Errorf("rendezvous: TLS %s: %w", ConfCert, err)
		}
		keyPEM, err := os.ReadFile(c.Key)
		if err != nil {
			return nil, fmt.Errorf("rendezvous: TLS %s: %w", ConfKey, err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("rendezvous: TLS %s=%s %s=%s: %w", ConfCert, c.Cert, ConfKey, c.Key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// Dial connects to etcd and returns a client once an endpoint has
// answered a Status call. It retries with exponential backoff, each
// attempt bounded by cfg.DialTimeout, for up to cfg.Patience, then fails
// with the endpoints, the patience and the last error, e.g.
//
//	rendezvous: no etcd answered at 127.0.0.1:2379 within 30s (last error: connection refused)
//
// It fails at once on bad TLS files, rejected credentials or any other
// answer that retrying cannot change (see transient), and returns
// ctx's error when ctx ends first. The caller closes the client; etcd's
// own client logs are silenced.
func Dial(ctx context.Context, cfg ClientConfig) (*clientv3.Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tlsCfg, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	dialTimeout := cmp.Or(cfg.DialTimeout, DefaultDialTimeout)
	patience := cmp.Or(cfg.Patience, DefaultPatience)
	ccfg := clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: dialTimeout,
		TLS:         tlsCfg,
		Username:    cfg.User,
		Password:    cfg.Password,
		Logger:      zap.NewNop(),
		Context:     context.WithoutCancel(ctx), // the client outlives Dial's ctx
		// A dead connection (a partition drops packets silently) is
		// closed once what it sent goes unacknowledged for
		// reconnectTimeout (gRPC sets TCP_USER_TIMEOUT to the keepalive
		// timeout), not when TCP's doubling retransmissions give up; and
		// the new one is tried again every reconnectMaxDelay at most: a
		// healed node's session is back within about a second, where gRPC's
		// default back-off (up to 2 minutes) and 20 s connect attempts
		// kept it away 12 s after a 15 s partition.
		DialKeepAliveTime:    keepAliveTime,
		DialKeepAliveTimeout: reconnectTimeout,
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: reconnectMaxDelay},
			MinConnectTimeout: reconnectTimeout,
		})},
	}

	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 50 * time.Millisecond
	bo.MaxInterval = 2 * time.Second
	bo.MaxElapsedTime = 0 // the deadline below bounds the wait
	deadlineCtx, cancel := context.WithTimeout(ctx, patience)
	defer cancel()

	var last error
	attempt := func() (*clientv3.Client, error) {
		actx, acancel := context.WithTimeout(deadlineCtx, dialTimeout)
		defer acancel()
		ep, err := firstReachable(actx, cfg.Endpoints, tlsCfg)
		ccfg := ccfg
		if err != nil && cfg.TLSIfOffered && tlsCfg != nil && plainAnswer(err) {
			// No TLS there: an etcd without the job's TLS.
			ccfg.TLS = nil
			ep, err = firstReachable(actx, cfg.Endpoints, nil)
		}
		if err != nil {
			return nil, err
		}
		cli, err := clientv3.New(ccfg)
		if err != nil {
			return nil, classify(err)
		}
		if _, err := cli.Status(actx, ep); err != nil {
			_ = cli.Close()
			return nil, classify(err)
		}
		return cli, nil
	}
	for {
		cli, err := attempt()
		if err == nil {
			return cli, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("rendezvous: dial etcd at %s: %w", strings.Join(cfg.Endpoints, ","), ctx.Err())
		}
		var perm *backoff.PermanentError
		if errors.As(err, &perm) {
			return nil, fmt.Errorf("rendezvous: etcd at %s: %w", strings.Join(cfg.Endpoints, ","), perm.Err)
		}
		if deadlineCtx.Err() == nil || last == nil {
			last = err // an attempt cut short by the deadline says less than the one before
		}
		wait := bo.NextBackOff()
		select {
		case <-deadlineCtx.Done():
			if ctx.Err() != nil {
				return nil, fmt.Errorf("rendezvous: dial etcd at %s: %w", strings.Join(cfg.Endpoints, ","), ctx.Err())
			}
			if errors.Is(last, context.DeadlineExceeded) {
				// The deadline cut short every attempt (a busy machine can spend the whole
				// patience before the first dial runs): one probe outside it names the
				// cause ("connection refused") instead of the deadline.
				pctx, pcancel := context.WithTimeout(ctx, dialTimeout)
				if _, err := firstReachable(pctx, cfg.Endpoints, tlsCfg); err != nil && pctx.Err() == nil {
					last = err
				}
				pcancel()
			}
			return nil, fmt.Errorf("rendezvous: no etcd answered at %s within %s (last error: %s)",
				strings.Join(cfg.Endpoints, ","), patience, describe(last))
		case <-time.After(wait):
		}
	}
}

// firstReachable returns the first endpoint that accepts a connection
// (and a TLS handshake, when the endpoint uses TLS), or the last error:
// it tells "connection refused" or a bad certificate from a timeout,
// which etcd's client (waiting for a ready connection) reports only as a
// deadline.
func firstReachable(ctx context.Context, endpoints []string, tlsCfg *tls.Config) (string, error) {
	var last error
	for _, ep := range endpoints {
		if last = probe(ctx, ep, tlsCfg); last == nil {
			return ep, nil
		}
	}
	return "", last
}

// probe connects to ep and, when it uses TLS, completes a handshake.
func probe(ctx context.Context, ep string, tlsCfg *tls.Config) error {
	hostport, _ := endpointHostPort(ep)
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", hostport)
	if err != nil {
		return err
	}
	defer conn.Close()
	if !strings.HasPrefix(ep, "https://") && (tlsCfg == nil || strings.HasPrefix(ep, "http://")) {
		return nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if tlsCfg != nil {
		cfg = tlsCfg.Clone()
	}
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(hostport)
	}
	if err := tls.Client(conn, cfg).HandshakeContext(ctx); err != nil {
		if ctx.Err() != nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
			return errNoHandshake
		}
		return classify(err)
	}
	return nil
}

// plainAnswer says whether err, from a TLS handshake, is what a server
// that does not speak TLS answers: a hang-up, no answer, or a reply that
// is not TLS.
func plainAnswer(err error) bool {
	var rec tls.RecordHeaderError
	return errors.Is(err, errNoHandshake) || errors.As(err, &rec)
}

// errNoHandshake is a TLS handshake that got no answer in time or a
// hang-up: what a plain-HTTP etcd does with a TLS client.
var errNoHandshake = errors.New("no TLS handshake (for an etcd without TLS, use http:// endpoints)")

// describe shortens a dial error to its cause: "connection refused"
// rather than "dial tcp 127.0.0.1:2379: connect: connection refused".
func describe(err error) string {
	if err == nil {
		return "none"
	}
	if errors.Is(err, errNoHandshake) {
		return err.Error()
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return dnsErr.Error()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer (timed out)"
	}
	return err.Error()
}
