package etcdembed

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/jobsecret"
)

// ClusterTokenPrefix starts every cluster token gorun makes: an embedded
// member's default (derived from its initial cluster) and a job's.
const ClusterTokenPrefix = "gorun-rdzv-"

// Defaults of Config, tuned for a rendezvous on a LAN: a few small
// keys, a handful of members, little history worth keeping.
const (
	DefaultHeartbeat       = 100 * time.Millisecond
	DefaultElectionTimeout = time.Second
	DefaultStartTimeout    = 60 * time.Second
)

const (
	serverSnapshotCount = 10000     // raft entries between snapshots (etcd: 100000)
	serverQuotaBytes    = 256 << 20 // backend size before a NOSPACE alarm (etcd: 2 GiB)
	serverKeepRevisions = "10000"   // revision-mode auto-compaction keeps this many
	tlsDirName          = "tls"     // in DataDir: the member's TLS files (writeMemberTLS)
)

// Config describes one embedded etcd member.
type Config struct {
	// Name is the member name, e.g. the host. Required.
	Name string
	// DataDir holds the member's WAL and database. Required.
	DataDir string
	// RemoveDataDir removes DataDir on Close: for a job's embedded member,
	// whose data is worthless once the job ends. A daemon keeps its dir.
	RemoveDataDir bool
	// ClientAddr is the host:port to listen on for clients. The host is
	// resolved to its first IPv4 address (never 0.0.0.0 unless given).
	ClientAddr string
	// PeerAddr is the host:port to listen on for the other members.
	PeerAddr string
	// InitialCluster maps every member name to its peer host:port. Empty
	// means a single member: {Name: PeerAddr}.
	InitialCluster map[string]string
	// ClusterToken tells clusters apart; members of one cluster agree on
	// it. Empty: derived from InitialCluster.
	ClusterToken string
	// Heartbeat and ElectionTimeout are raft's timings (0: 100 ms and 1 s,
	// suitable for a LAN). ElectionTimeout must be at least 5 heartbeats.
	Heartbeat, ElectionTimeout time.Duration
	// StartTimeout bounds Start's wait for the member to be ready,
	// which needs a quorum of InitialCluster up (0: 60 s).
	StartTimeout time.Duration
	// UnsafeNoFsync skips fsync: for tests only, a crash loses data.
	UnsafeNoFsync bool
	// Secret, when set, makes the member speak only mutual TLS on its
	// client and peer ports, with certificates of the job's CA (NewPKI:
	// every holder of Secret derives the same; the member writes its own
	// certificate into DataDir/tls), and turns on etcd's authentication
	// before Start returns: only the user and password Credentials(Secret)
	// gives may read or write, and only keys under AuthPrefix. Clients
	// need ClientTLS(Secret) as well. Every member of a
	// cluster must have the same Secret; a data dir keeps the secret it
	// was first started with. Passwords are hashed with bcrypt's minimum
	// cost (they are 256-bit keys, slow hashing adds nothing but CPU per
	// agent) and a token lives a day without use, so an agent
	// authenticates once per connection. The zero Secret: no
	// authentication, anyone who reaches the port may do anything.
	Secret jobsecret.Secret `json:"-"`
	// Log receives etcd's own warnings and errors (component=etcd); its
	// info and debug logs are dropped. The zero Logger drops everything.
	Log zerolog.Logger
}

// Validate reports the first problem of c, naming the field.
func (c Config) Validate() error {
	if c.Name == "" {
		return errors.New("rendezvous: server: empty member name")
	}
	if strings.ContainsAny(c.Name, "=,") {
		return fmt.Errorf("rendezvous: server: member name %q has '=' or ','", c.Name)
	}
	if c.DataDir == "" {
		return errors.New("rendezvous: server: empty data dir")
	}
	if err := checkAddr("client address", c.ClientAddr); err != nil {
		return err
	}
	if err := checkAddr("peer address", c.PeerAddr); err != nil {
		return err
	}
	if c.ClientAddr == c.PeerAddr {
		return fmt.Errorf("rendezvous: server: client and peer address are both %s", c.ClientAddr)
	}
	if len(c.InitialCluster) > 0 {
		peer, ok := c.InitialCluster[c.Name]
		if !ok {
			return fmt.Errorf("rendezvous: server: initial cluster has no member %q", c.Name)
		}
		if peer != c.PeerAddr {
			return fmt.Errorf("rendezvous: server: initial cluster says member %q is at %s, its peer address is %s", c.Name, peer, c.PeerAddr)
		}
		for name, addr := range c.InitialCluster {
			if name == "" || strings.ContainsAny(name, "=,") {
				return fmt.Errorf("rendezvous: server: initial cluster member name %q is empty or has '=' or ','", name)
			}
			if err := checkAddr("initial cluster address of "+name, addr); err != nil {
				return err
			}
		}
	}
	if c.Heartbeat < 0 || c.ElectionTimeout < 0 || c.StartTimeout < 0 {
		return errors.New("rendezvous: server: negative heartbeat, election or start timeout")
	}
	hb, el := cmp.Or(c.Heartbeat, DefaultHeartbeat), cmp.Or(c.ElectionTimeout, DefaultElectionTimeout)
	if hb < time.Millisecond || el < 5*hb {
		return fmt.Errorf("rendezvous: server: election timeout %s must be at least 5 heartbeats of %s (>= 1ms)", el, hb)
	}
	return nil
}

func checkAddr(what, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("rendezvous: server: %s %q: want host:port", what, addr)
	}
	if host == "" {
		return fmt.Errorf("rendezvous: server: %s %q: empty host (give the node's own address)", what, addr)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("rendezvous: server: %s %q: port must be 1-65535", what, addr)
	}
	return nil
}

// Server is one running embedded etcd member.
type Server struct {
	etcd      *embed.Etcd
	endpoints []string
	dataDir   string
	removeDir bool

	closing atomic.Bool // set by Leaving or Close: etcd's shutdown noise goes to debug
	trap    *fatalTrap  // etcd's panics and fatal errors, as errors
	errc    chan error  // Err's channel: forwardErr fills and closes it
	lock    *os.File    // holds the data dir's flock (lockDataDir); nil: none

	election time.Duration // raft's election timeout (UntilQuorumLost)

	closeOnce sync.Once
	closeErr  error
}

// Start starts the member described by cfg and returns once it is
// ready to serve clients, which needs a quorum of cfg.InitialCluster up.
// Host names in the addresses are resolved to their first IPv4 address.
// It gives up, stops the member and returns an error when ctx ends, when
// cfg.StartTimeout passes, or when etcd fails to start (a port in use, a
// data dir in use by another member or of another cluster), or when it
// cannot turn on or confirm the authentication cfg.Secret asks for. It
// does not retry. Errors are one line naming the port or the directory
// at fault; etcd's own panics and fatal errors come back as errors too
// (fatalTrap), never as a stack trace or an exit of the process.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{dataDir: cfg.DataDir, removeDir: cfg.RemoveDataDir, trap: newFatalTrap(),
		election: cmp.Or(cfg.ElectionTimeout, DefaultElectionTimeout)}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("rendezvous: server data dir: %w", err)
	}
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err // not ours to remove
	}
	s.lock = lock
	fresh := !memberInitialized(cfg.DataDir)
	ecfg, err := embedConfig(ctx, cfg, &s.closing, s.trap)
	if err != nil {
		return nil, errors.Join(err, s.Close())
	}
	for _, u := range ecfg.AdvertiseClientUrls {
		s.endpoints = append(s.endpoints, u.String())
	}
	e, err := startEtcd(ecfg, s.trap)
	if err != nil {
		return nil, errors.Join(startError(cfg, err), s.Close())
	}
	s.etcd = e
	s.errc = make(chan error, 1)
	go s.forwardErr()
	timeout := cmp.Or(cfg.StartTimeout, DefaultStartTimeout)
	deadline := time.Now().Add(timeout)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var fail error
	select {
	case <-e.Server.ReadyNotify():
		if fail = s.secure(ctx, cfg, deadline, fresh); fail == nil {
			return s, nil
		}
	case err := <-s.errc:
		fail = fmt.Errorf("rendezvous: etcd member %s failed while starting: %w", cfg.Name, startError(cfg, err))
	case <-e.Server.StopNotify():
		fail = fmt.Errorf("rendezvous: etcd member %s stopped while starting", cfg.Name)
	case <-timer.C:
		fail = fmt.Errorf("rendezvous: etcd member %s not ready within %s (a majority of the %d members must be up: %s)",
			cfg.Name, timeout, strings.Count(ecfg.InitialCluster, ",")+1, ecfg.InitialCluster)
	case <-ctx.Done():
		fail = fmt.Errorf("rendezvous: etcd member %s: start: %w", cfg.Name, ctx.Err())
	}
	return nil, errors.Join(fail, s.Close())
}

// startEtcd runs embed.StartEtcd on a goroutine of its own, so that a
// panic or fatal error etcd logs while starting (trap: it ends the
// goroutine that logged it) ends that goroutine, not the caller's, and
// comes back as the error; so does a panic of etcd's own while starting
// (e.g. a nil pointer on a damaged WAL), recovered. What etcd opened
// before it failed that way is left to the process's exit.
func startEtcd(cfg *embed.Config, trap *fatalTrap) (*embed.Etcd, error) {
	type result struct {
		e   *embed.Etcd
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- result{err: fmt.Errorf("%w: %v", errStartCrash, r)}
			}
		}()
		e, err := embed.StartEtcd(cfg)
		done <- result{e, err}
	}()
	select {
	case r := <-done:
		return r.e, r.err
	case err := <-trap.c:
		return nil, err
	}
}

// errStartCrash is a panic of etcd's own while starting, recovered: in
// practice its bootstrap, on a data dir it cannot read.
var errStartCrash = errors.New("etcd crashed while reading it")

// forwardErr passes the member's first serving error, from etcd or its
// logger's trap, to errc, and closes errc when etcd's channel closes
// (Close) or after the error.
func (s *Server) forwardErr() {
	defer close(s.errc)
	select {
	case err, ok := <-s.etcd.Err():
		if ok {
			s.errc <- err
		}
	case err := <-s.trap.c:
		s.errc <- err
	}
}

// startError makes err, from etcd starting, say what to do: a port in
// use is named as the member's client or peer port; a data dir etcd
// could not use is named.
func startError(cfg Config, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		what, addr := "port", ""
		var op *net.OpError
		if errors.As(err, &op) && op.Addr != nil {
			addr = op.Addr.String()
		}
		switch _, port, _ := net.SplitHostPort(addr); {
		case addr == "":
		case port == portOf(cfg.ClientAddr):
			what = "client port"
		case port == portOf(cfg.PeerAddr):
			what = "peer port"
		}
		// %w keeps EADDRINUSE for callers that fall back (a c10d host that
		// finds the endpoint taken becomes a client).
		return fmt.Errorf("rendezvous: etcd member %s: %s %s is in use by another process (another gorun or etcd of this job on this machine?): "+
			"stop it, or give this one other ports (%w)", cfg.Name, what, cmp.Or(addr, cfg.ClientAddr+" or "+cfg.PeerAddr), syscall.EADDRINUSE)
	}
	msg := err.Error()
	if errors.Is(err, errStartCrash) || strings.Contains(msg, "WAL") || strings.Contains(msg, "snapshot") || strings.Contains(msg, "backend") ||
		strings.Contains(msg, "data dir") || strings.Contains(msg, "member dir") {
		return fmt.Errorf("rendezvous: etcd member %s cannot use its data dir %s: %w (another etcd member using it, or left by another cluster? give this one a data dir of its own)",
			cfg.Name, cfg.DataDir, err)
	}
	return fmt.Errorf("rendezvous: start etcd member %s at %s: %w", cfg.Name, cfg.ClientAddr, err)
}

// portOf returns the port of host:port, "" when addr is not one.
func portOf(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}

// lockDataDir takes an exclusive flock on dir, so that a second member
// started on the same data dir (two gorun rendezvous serve, two agents)
// fails at once naming it, before etcd finds its WAL locked or half
// made. The kernel drops the lock when the process dies.
func lockDataDir(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: server data dir: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("rendezvous: etcd data dir %s is in use by another etcd member (another gorun or gorun rendezvous serve on this machine): give each its own data dir", dir)
		}
		return nil, fmt.Errorf("rendezvous: lock etcd data dir %s: %w", dir, err)
	}
	return f, nil
}

// memberInitialized says whether dir holds a member's data already (etcd
// keeps it in dir/member).
func memberInitialized(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "member"))
	return err == nil
}

// secure turns on the authentication cfg.Secret asks for (enableAuth),
// giving up when ctx ends or at deadline. fresh: the member started on
// an empty data dir.
func (s *Server) secure(ctx context.Context, cfg Config, deadline time.Time, fresh bool) error {
	if cfg.Secret.IsZero() {
		return nil
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := enableAuth(ctx, s.etcd.Server, cfg.Secret, fresh); err != nil {
		return fmt.Errorf("%w (etcd member %s)", err, cfg.Name)
	}
	return nil
}

// embedConfig translates cfg into etcd's configuration, resolving host
// names to addresses.
func embedConfig(ctx context.Context, cfg Config, closing *atomic.Bool, trap *fatalTrap) (*embed.Config, error) {
	scheme := "http" // no secret: members and clients speak plain HTTP/2 on the LAN
	if !cfg.Secret.IsZero() {
		scheme = "https"
	}
	clientURL, err := resolveURL(ctx, cfg.ClientAddr, scheme)
	if err != nil {
		return nil, err
	}
	peerURL, err := resolveURL(ctx, cfg.PeerAddr, scheme)
	if err != nil {
		return nil, err
	}
	cluster := cfg.InitialCluster
	if len(cluster) == 0 {
		cluster = map[string]string{cfg.Name: cfg.PeerAddr}
	}
	names := make([]string, 0, len(cluster))
	for name := range cluster {
		names = append(names, name)
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, name := range names {
		u := peerURL
		if name != cfg.Name {
			if u, err = resolveURL(ctx, cluster[name], scheme); err != nil {
				return nil, err
			}
		}
		parts = append(parts, name+"="+u.String())
	}
	token := cfg.ClusterToken
	if token == "" {
		h := fnv.New64a()
		h.Write([]byte(strings.Join(parts, ",")))
		token = ClusterTokenPrefix + strconv.FormatUint(h.Sum64(), 36)
	}

	e := embed.NewConfig()
	e.Name = cfg.Name
	e.Dir = cfg.DataDir
	e.ListenClientUrls = []url.URL{clientURL}
	e.AdvertiseClientUrls = []url.URL{clientURL}
	e.ListenPeerUrls = []url.URL{peerURL}
	e.AdvertisePeerUrls = []url.URL{peerURL}
	e.InitialCluster = strings.Join(parts, ",")
	e.InitialClusterToken = token
	e.ClusterState = embed.ClusterStateFlagNew
	e.TickMs = uint(cmp.Or(cfg.Heartbeat, DefaultHeartbeat) / time.Millisecond)
	e.ElectionMs = uint(cmp.Or(cfg.ElectionTimeout, DefaultElectionTimeout) / time.Millisecond)
	e.SnapshotCount = serverSnapshotCount
	e.AutoCompactionMode = embed.CompactorModeRevision
	e.AutoCompactionRetention = serverKeepRevisions
	e.QuotaBackendBytes = serverQuotaBytes
	e.UnsafeNoFsync = cfg.UnsafeNoFsync
	e.EnableGRPCGateway = false
	e.BcryptCost = bcryptCost
	e.AuthTokenTTL = tokenTTL
	if !cfg.Secret.IsZero() {
		if err := memberTLS(e, cfg); err != nil {
			return nil, err
		}
	}
	e.Logger = "zap"
	e.LogLevel = "warn"
	e.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(zerologCore{
		log:     cfg.Log.With().Str("component", "etcd").Str("member", cfg.Name).Logger(),
		closing: closing,
	}, zap.WithPanicHook(trap), zap.WithFatalHook(trap)))
	return e, nil
}

// memberTLS writes the member's TLS files for cfg.Secret into
// cfg.DataDir/tls and sets e to speak only mutual TLS with them on both
// ports. The certificate names the member's resolved addresses and the
// host names cfg gives. Client certificates must come from the job's CA;
// their names are not checked against the address they come from (a
// member or agent may dial from any of its addresses).
func memberTLS(e *embed.Config, cfg Config) error {
	var hosts []string
	for _, u := range slices.Concat(e.ListenClientUrls, e.ListenPeerUrls) {
		hosts = append(hosts, u.Hostname())
	}
	for _, addr := range []string{cfg.ClientAddr, cfg.PeerAddr} {
		host, _, _ := net.SplitHostPort(addr)
		hosts = append(hosts, host)
	}
	ips, names := certNames(hosts...)
	files, err := writeMemberTLS(filepath.Join(cfg.DataDir, tlsDirName), cfg.Secret, cfg.Name, ips, names)
	if err != nil {
		return err
	}
	info := transport.TLSInfo{
		CertFile: files.cert, KeyFile: files.key, TrustedCAFile: files.ca,
		ClientCertFile: files.cert, ClientKeyFile: files.key,
		ClientCertAuth: true, SkipClientSANVerify: true, MinVersion: tls.VersionTLS12,
	}
	e.ClientTLSInfo, e.PeerTLSInfo = info, info
	return nil
}

// resolveURL turns host:port into scheme://IP:port, the host resolved to
// its first IPv4 address (an IP literal is kept as it is).
func resolveURL(ctx context.Context, addr, scheme string) (url.URL, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return url.URL{}, fmt.Errorf("rendezvous: address %q: %w", addr, err)
	}
	ip, err := ResolveIPv4(ctx, host)
	if err != nil {
		return url.URL{}, err
	}
	return url.URL{Scheme: scheme, Host: net.JoinHostPort(ip, port)}, nil
}

// ResolveIPv4 returns host's first IPv4 address as text; an IP literal is
// returned as it is. The lookup uses the system resolver (/etc/hosts,
// then DNS) and gives up when ctx ends.
func ResolveIPv4(ctx context.Context, host string) (string, error) {
	if ip := net.ParseIP(host); ip != nil {
		return host, nil
	}
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return "", fmt.Errorf("rendezvous: resolve %s: %w", host, err)
	}
	for _, a := range addrs {
		if v4 := a.IP.To4(); v4 != nil {
			return v4.String(), nil
		}
	}
	return "", fmt.Errorf("rendezvous: resolve %s: no IPv4 address (got %v)", host, addrs)
}

// Leaving says that the job the member serves is over: the other members
// stopping is expected from now on, so etcd's warnings and errors about
// lost peers and a lost quorum are logged at debug level, as during
// Close. It does not stop the member.
func (s *Server) Leaving() { s.closing.Store(true) }

// Endpoints returns the member's client URLs, e.g. http://10.0.0.1:30000.
func (s *Server) Endpoints() []string { return slices.Clone(s.endpoints) }

// Err receives a fatal serving error of the member (e.g. a listener
// failing, or a panic or fatal error etcd logged, which ended only the
// goroutine that logged it); the member should then be closed. Close
// closes the channel.
func (s *Server) Err() <-chan error { return s.errc }

// Close stops the member and is safe to call more than once; later calls
// return the first call's result. The order is etcd's own (embed.Close):
// stop accepting client requests, give in-flight ones up to the request
// timeout (5 s + 2 election timeouts) to finish, close the client
// listeners, stop raft (transferring leadership if this member leads
// others), close the peer connections. A member that never became ready
// (no quorum yet) has its raft server stopped first. Then Close removes the data dir if
// cfg.RemoveDataDir said so.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.closing.Store(true)
		if s.etcd != nil {
			stopUnready(s.etcd)
			s.etcd.Close()
		}
		s.closeErr = s.removeData()
		if s.lock != nil {
			s.lock.Close() // drops the flock, after the data dir is gone
		}
	})
	return s.closeErr
}

// stopUnready stops the raft server of a member that never became ready:
// embed.Close waits for the client servers, which wait for the member to
// be ready or stopping, and would wait forever.
func stopUnready(e *embed.Etcd) {
	select {
	case <-e.Server.ReadyNotify():
	default:
		e.Server.HardStop()
	}
}

func (s *Server) removeData() error {
	if !s.removeDir {
		return nil
	}
	if err := os.RemoveAll(s.dataDir); err != nil {
		return fmt.Errorf("rendezvous: remove etcd data dir: %w", err)
	}
	return nil
}
