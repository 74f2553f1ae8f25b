package launcher

import (
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
	"github.com/gorun/gorun/slurm"
)

// Rendezvous backends after resolution.
const (
	BackendStatic = "static" // every node knows the job up front; nothing shared
	BackendEtcd   = "etcd"   // elastic rounds over etcd v3
)

// Rendezvous says how this node finds the others.
type Rendezvous struct {
	Backend   string        `json:"backend"`
	Endpoint  string        `json:"endpoint,omitempty"` // as given
	Endpoints []string      `json:"endpoints,omitempty"`
	Embedded  *EmbeddedPlan `json:"embedded,omitempty"` // SLURM without an endpoint: etcd on the job's first nodes; c10d: at the endpoint
	// Member is the embedded etcd member this node runs; nil: it runs none.
	Member *EmbeddedMember `json:"member,omitempty"`
	// Hosting says, for a c10d endpoint, where its embedded etcd runs and
	// why this node does or does not run it.
	Hosting string `json:"hosting,omitempty"`
	// HostGuessed says that this node hosts the c10d endpoint by
	// ownsEndpoint's heuristic rather than --rdzv-conf is_host: if the
	// endpoint's port is taken, it goes on as a client (clientFallback).
	HostGuessed bool `json:"host_guessed,omitempty"`
	// Generation is SLURM_RESTART_COUNT: a requeued job (a larger one,
	// same run id) starts a new incarnation of its run.
	Generation int                    `json:"generation,omitempty"`
	ID         string                 `json:"id"`
	NodeID     string                 `json:"node_id,omitempty"` // unique per agent process
	Conf       map[string]string      `json:"conf,omitempty"`
	Client     etcdstore.ClientConfig `json:"-"`
	// Launch tells this launch of the run id from others (etcdstore.Conn.Enter):
	// under SLURM its restart count and step, and whether it can be told
	// apart at all (under SLURM, or on an etcd embedded for it).
	Launch etcdstore.Launch `json:"-"`
	// Auth says how this agent authenticates to etcd when the job
	// secret does it (resolveSecret); else --rdzv-conf says.
	Auth   string            `json:"auth,omitempty"`
	Timing RendezvousTiming  `json:"timing"`
	Limits rendezvous.Limits `json:"limits"`
}

// RendezvousTiming are the etcd rendezvous's clocks (--rdzv-conf).
type RendezvousTiming struct {
	LeaseTTL    Duration `json:"lease_ttl"`         // a dead node is noticed this long after its last keep-alive
	LastCall    Duration `json:"last_call_timeout"` // after MIN nodes joined, wait this long for more
	JoinTimeout Duration `json:"join_timeout"`      // a round that has not formed by then fails the job
}

// --rdzv-conf keys of the protocol; rendezvous.Conf* are the client's.
const (
	confLeaseTTL    = "lease_ttl"
	confLastCall    = "last_call_timeout"
	confJoinTimeout = "join_timeout"
	// confTimeout is torchrun's etcd rendezvous's join timeout; its
	// c10d and etcd-v2 (dynamic) rendezvous ignore it.
	confTimeout    = "timeout"
	confMaxChanges = "max_membership_changes"
	confIsHost     = "is_host" // torchrun's: whether this node hosts the c10d endpoint

	// torchrun's c10d keys. A node is dead when its keep-alives lapse
	// for keep_alive_interval x keep_alive_max_attempt: gorun's lease
	// TTL. The others tune torchrun's TCPStore and have no counterpart.
	confKeepAliveInterval = "keep_alive_interval" // seconds (torchrun: 5)
	confKeepAliveAttempts = "keep_alive_max_attempt"
	confReadTimeout       = "read_timeout"      // seconds: the TCPStore's request timeout; gorun retries etcd until join_timeout
	confCloseTimeout      = "close_timeout"     // seconds: torchrun's wait to close the rendezvous; gorun's host lingers for the others itself
	confHeartbeat         = "heartbeat_timeout" // seconds: torchrun's keep-alive deadline; etcd keeps leases alive itself
	confUseLibuv          = "use_libuv"         // the TCPStore's event loop
	confStoreType         = "store_type"        // tcp | file: torchrun's c10d store; gorun's is etcd at the endpoint
)

// torchrun's etcd-v2 backend names the TLS files of the etcd client
// ssl_cert, ssl_cert_key and ca_cert, and says protocol=http|https.
const (
	confProtocol   = "protocol"
	confSSLCert    = "ssl_cert"
	confSSLCertKey = "ssl_cert_key"
	confCACertV2   = "ca_cert"
)

// etcdV2Keys turns torchrun's etcd-v2 keys into gorun's (cert, key,
// cacert) in conf. protocol=http is the default; protocol=https needs a
// certificate to verify etcd's or to present (gorun uses TLS exactly
// when it has one).
func etcdV2Keys(conf map[string]string) error {
	for v2, key := range map[string]string{confSSLCert: etcdstore.ConfCert, confSSLCertKey: etcdstore.ConfKey, confCACertV2: etcdstore.ConfCACert} {
		v, ok := conf[v2]
		if !ok {
			continue
		}
		if have, set := conf[key]; set && have != v {
			return usagef("--rdzv-conf %s=%s and %s=%s name the same file differently: give one", v2, v, key, have)
		}
		delete(conf, v2)
		conf[key] = v
	}
	p, ok := conf[confProtocol]
	if !ok {
		return nil
	}
	delete(conf, confProtocol)
	switch strings.ToLower(strings.TrimSpace(p)) {
	case "http":
		return nil
	case "https":
		if conf[etcdstore.ConfCACert] == "" && conf[etcdstore.ConfCert] == "" {
			return usagef("--rdzv-conf %s=https: give %s= (the CA file that signs etcd's certificate) or %s=,%s= (a client certificate); gorun speaks TLS to etcd when it has one", confProtocol, confCACertV2, confSSLCert, confSSLCertKey)
		}
		return nil
	}
	return usagef("--rdzv-conf %s=%s: want http or https", confProtocol, p)
}

// torchrun's keep-alive defaults: a node is dead after 3 missed 5 s
// keep-alives.
const (
	torchrunKeepAliveInterval = 5 * time.Second
	torchrunKeepAliveAttempts = 3
)

// Defaults: etcd leases are coarse, so a TTL under 5 s buys little; the
// last call and join timeout are torchrun's.
const (
	defaultLeaseTTL    = 5 * time.Second
	defaultLastCall    = 30 * time.Second
	defaultJoinTimeout = 600 * time.Second
	defaultMaxChanges  = 10
)

var knownConf = []string{
	confLeaseTTL, confLastCall, confJoinTimeout, confTimeout, confMaxChanges, confIsHost,
	confKeepAliveInterval, confKeepAliveAttempts, confReadTimeout, confCloseTimeout, confHeartbeat, confUseLibuv, confStoreType,
	etcdstore.ConfCACert, etcdstore.ConfCert, etcdstore.ConfKey, etcdstore.ConfUser,
	etcdstore.ConfPassword, etcdstore.ConfDialTimeout, etcdstore.ConfConnectTimeout,
}

// chooseBackend picks static or etcd from what the user asked for:
// --standalone and one-node jobs are static; without a backend, an
// endpoint with a fixed --nnodes and an explicit --node-rank is torchrun's
// default, static at the endpoint as the master; a SLURM job of several
// nodes is elastic over an embedded etcd unless an endpoint is given;
// elsewhere an endpoint (nodes without ranks), an explicit etcd backend
// or a MIN:MAX range mean etcd.
// torchrun's c10d with an endpoint and more than one node is etcd too,
// over an etcd that the node owning the endpoint's address embeds
// (hostAtEndpoint); c10d without an endpoint, or on one node, stays
// static, as does static.
func (l *Launch) chooseBackend(opts Options, underSLURM, rankKnown bool) (string, error) {
	asked := strings.ToLower(opts.RdzvBackend)
	elastic := l.MinNodes != l.MaxNodes
	if l.c10dAtEndpoint(opts) {
		return BackendEtcd, nil
	}
	switch asked {
	case "etcd", "etcd-v2", "etcd-v3":
		if opts.Standalone {
			return "", usagef("--standalone needs no rendezvous: drop --rdzv-backend=%s", opts.RdzvBackend)
		}
		if opts.RdzvEndpoint == "" && !underSLURM {
			return "", usagef("--rdzv-backend=%s: give --rdzv-endpoint HOST:PORT of an etcd (start one with gorun rendezvous serve)", opts.RdzvBackend)
		}
		return BackendEtcd, nil
	case "static", "c10d":
		if elastic {
			return "", usagef("--nnodes=%s: an elastic range needs --rdzv-backend=etcd (static and c10d rendezvous need a fixed number of nodes)", opts.NNodes)
		}
		if l.MaxNodes > 1 && !rankKnown {
			return "", usagef("--rdzv-backend=%s with --nnodes=%d: give each node its --node-rank, or use --rdzv-backend=etcd to rank nodes as they join", opts.RdzvBackend, l.MinNodes)
		}
		return BackendStatic, nil
	case "":
	default:
		return "", usagef("--rdzv-backend=%s: want etcd, static or c10d", opts.RdzvBackend)
	}
	switch {
	case opts.Standalone || l.MaxNodes == 1:
		return BackendStatic, nil
	case underSLURM && opts.RdzvEndpoint == "" && !elastic && masterGiven(opts):
		// torchrun's static recipe under srun: the master it names is
		// honoured; gorun's elastic rounds would move it to node rank 0.
		l.note("--master-addr/--master-port under SLURM: static rendezvous at the given master, as torchrun; drop them for gorun's elastic etcd rendezvous (a job-wide first failure, node losses survived)")
		return BackendStatic, nil
	case opts.RdzvEndpoint != "" && !elastic && opts.NodeRank >= 0:
		// torchrun's default backend is static, its master the endpoint:
		// every node names its rank, so nothing needs to rank them.
		return BackendStatic, nil
	case underSLURM || opts.RdzvEndpoint != "":
		return BackendEtcd, nil
	case elastic:
		return "", usagef("--nnodes=%s: an elastic range needs an etcd: give --rdzv-endpoint HOST:PORT (start one with gorun rendezvous serve)", opts.NNodes)
	case !rankKnown:
		return "", usagef("--nnodes=%d without SLURM: give each node its --node-rank (0..%d) and --master-addr, or --rdzv-endpoint of an etcd", l.MinNodes, l.MinNodes-1)
	}
	return BackendStatic, nil
}

// masterGiven says whether the user named worker rank 0's store.
func masterGiven(opts Options) bool { return opts.MasterAddr != "" || opts.MasterPort != 0 }

// checkMasterUnused deals with --master-addr/--master-port given to an
// etcd rendezvous, where node rank 0 of each round hosts the workers'
// store at a port it picks: torchrun's c10d recipe ignores them with a
// warning, and so does gorun; an etcd backend asked for by name, or an
// elastic range, refuses them rather than drop them.
func (l *Launch) checkMasterUnused(opts Options) error {
	if !masterGiven(opts) {
		return nil
	}
	const why = "with etcd rendezvous worker rank 0's store is on node rank 0 of each round, at a port it picks"
	if l.c10dAtEndpoint(opts) {
		l.note("--master-addr/--master-port ignored, as torchrun ignores them with --rdzv-backend=c10d: " + why)
		return nil
	}
	return usagef("--master-addr/--master-port: only static rendezvous uses them (%s); drop them, or give --rdzv-backend=static with a fixed --nnodes", why)
}

// c10dAtEndpoint says whether opts ask for torchrun's c10d rendezvous at
// an endpoint for a job of several nodes: gorun's etcd rendezvous, hosted
// at that endpoint.
func (l *Launch) c10dAtEndpoint(opts Options) bool {
	return strings.EqualFold(opts.RdzvBackend, "c10d") && opts.RdzvEndpoint != "" && !opts.Standalone && l.MaxNodes > 1
}

// resolveEtcd fills the etcd rendezvous: endpoints (given; a c10d
// endpoint's embedded etcd; or the job's embedded members under SLURM),
// the member this node runs, timing and budgets from --rdzv-conf.
func (l *Launch) resolveEtcd(opts Options, job slurm.Job, underSLURM bool, host Host) error {
	r := &l.Rendezvous
	if err := etcdV2Keys(r.Conf); err != nil {
		return err
	}
	conf := r.Conf
	l.dropUnknownConf(opts, conf)
	if err := l.checkMasterUnused(opts); err != nil {
		return err
	}
	c10d := l.c10dAtEndpoint(opts)
	if _, ok := conf[confIsHost]; ok && !c10d {
		return usagef("--rdzv-conf %s: only --rdzv-backend=c10d with an --rdzv-endpoint has a node that hosts the rendezvous", confIsHost)
	}
	switch {
	case c10d:
		if err := l.hostAtEndpoint(opts, host); err != nil {
			return err
		}
	case opts.RdzvEndpoint != "":
		for _, ep := range strings.Split(opts.RdzvEndpoint, ",") {
			if ep = strings.TrimSpace(ep); ep != "" {
				r.Endpoints = append(r.Endpoints, ep)
			}
		}
	case underSLURM:
		plan := PlanEmbedded(job.JobID, job.Nodes)
		r.Embedded, r.Endpoints = &plan, plan.Endpoints
		if job.NodeID < len(job.Nodes) {
			if m, ok := plan.MemberFor(job.Nodes[job.NodeID]); ok {
				r.Member = &m
			}
		}
	}
	if underSLURM {
		r.Generation = job.RestartCount
		r.Launch.Step = job.StepID
	}
	r.Launch.Generation, r.Launch.Identified = r.Generation, underSLURM || r.Embedded != nil
	var err error
	if r.Client, err = etcdstore.ClientConfigFromConf(r.Endpoints, conf); err != nil {
		return usagef("%v", err)
	}
	r.Timing = RendezvousTiming{LeaseTTL: Duration(defaultLeaseTTL), LastCall: Duration(defaultLastCall), JoinTimeout: Duration(defaultJoinTimeout)}
	durations := []struct {
		keys []string
		dst  *Duration
		min  time.Duration
	}{
		{[]string{confLeaseTTL}, &r.Timing.LeaseTTL, time.Second},
		{[]string{confLastCall}, &r.Timing.LastCall, 0},
		{[]string{confJoinTimeout, confTimeout}, &r.Timing.JoinTimeout, time.Millisecond},
	}
	for _, d := range durations {
		for _, key := range d.keys {
			v, ok := conf[key]
			if !ok {
				continue
			}
			dur, err := parseConfDuration(v)
			if err != nil || dur < d.min {
				return usagef("--rdzv-conf %s=%s: want a duration of at least %s, like 30s (or seconds: 30)", key, v, d.min)
			}
			*d.dst = Duration(dur)
		}
	}
	if err := r.torchrunKeys(conf); err != nil {
		return err
	}
	if _, set := conf[etcdstore.ConfConnectTimeout]; c10d && !set {
		// Waiting for the node that hosts the endpoint to come up is part
		// of waiting for the round to form, which join_timeout bounds.
		r.Client.Patience = r.Timing.JoinTimeout.Std()
	}
	r.Limits = rendezvous.Limits{MinNodes: l.MinNodes, MaxNodes: l.MaxNodes, StartNodes: l.StartNodes, MaxFailures: l.MaxRestarts, MaxChanges: defaultMaxChanges}
	if v, ok := conf[confMaxChanges]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return usagef("--rdzv-conf %s=%s: want a number of restarts, 0 or more", confMaxChanges, v)
		}
		r.Limits.MaxChanges = n
	}
	r.NodeID = fmt.Sprintf("%s.%d", l.Host, os.Getpid())
	return nil
}

// dropUnknownConf takes out of conf, with a note naming each, the
// --rdzv-conf keys that torchrun's rendezvous would ignore: keys nobody
// reads (torchrun reads what it knows and ignores the rest; a value
// quoted twice, --rdzv-conf="'join_timeout=5,timeout=5'", gives it keys
// and values with quotes in them), and timeout with the dynamic (c10d,
// etcd-v2) rendezvous, which reads join_timeout instead.
func (l *Launch) dropUnknownConf(opts Options, conf map[string]string) {
	for _, k := range slices.Sorted(maps.Keys(conf)) {
		if slices.Contains(knownConf, k) {
			continue
		}
		msg := fmt.Sprintf("--rdzv-conf: unknown key %q ignored, as torchrun ignores it (known: %s)", k, strings.Join(slices.Sorted(slices.Values(knownConf)), ", "))
		if strings.ContainsAny(k, `'"`) {
			msg += "; the quotes are part of the key: the shell passed them on, drop them"
		}
		l.note(msg)
		delete(conf, k)
	}
	backend := strings.ToLower(opts.RdzvBackend)
	if _, ok := conf[confTimeout]; ok && (backend == "c10d" || backend == "etcd-v2") {
		l.note(fmt.Sprintf("--rdzv-conf %s=%s ignored, as torchrun's %s rendezvous ignores it: %s sets how long a round may take to form (default %s)",
			confTimeout, conf[confTimeout], backend, confJoinTimeout, defaultJoinTimeout))
		delete(conf, confTimeout)
	}
}

// parseConfDuration reads "30s", "1m" or "30" (seconds).
func parseConfDuration(v string) (time.Duration, error) { return ParseSeconds(v) }

// torchrunKeys reads torchrun's c10d keys: keep_alive_interval and
// keep_alive_max_attempt make the lease TTL (unless lease_ttl is given);
// read_timeout, close_timeout, heartbeat_timeout, use_libuv and
// store_type (tcp) are checked and change nothing.
func (r *Rendezvous) torchrunKeys(conf map[string]string) error {
	interval, attempts := torchrunKeepAliveInterval, torchrunKeepAliveAttempts
	for _, key := range []string{confKeepAliveInterval, confReadTimeout, confCloseTimeout, confHeartbeat} {
		v, ok := conf[key]
		if !ok {
			continue
		}
		d, err := ParseSeconds(v)
		if err != nil || d <= 0 {
			return usagef("--rdzv-conf %s=%s: want a positive number of seconds", key, v)
		}
		if key == confKeepAliveInterval {
			interval = d
		}
	}
	if v, ok := conf[confKeepAliveAttempts]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return usagef("--rdzv-conf %s=%s: want a number of keep-alives, 1 or more", confKeepAliveAttempts, v)
		}
		attempts = n
	}
	if v, ok := conf[confStoreType]; ok && !strings.EqualFold(strings.TrimSpace(v), "tcp") {
		return usagef("--rdzv-conf %s=%s: gorun's c10d rendezvous is an etcd served at the endpoint, torchrun's TCP store's counterpart; it has no file store: drop %s or give tcp", confStoreType, v, confStoreType)
	}
	if v, ok := conf[confUseLibuv]; ok {
		if _, err := parseConfBool(v); err != nil {
			return usagef("--rdzv-conf %s=%s: %v", confUseLibuv, v, err)
		}
	}
	_, keepAlive := conf[confKeepAliveInterval]
	_, keepAttempts := conf[confKeepAliveAttempts]
	if _, ttl := conf[confLeaseTTL]; !ttl && (keepAlive || keepAttempts) {
		if interval > time.Duration(math.MaxInt64)/time.Duration(attempts) {
			return usagef("--rdzv-conf %s x %s: %s x %d is too long", confKeepAliveInterval, confKeepAliveAttempts, interval, attempts)
		}
		r.Timing.LeaseTTL = Duration(max(interval*time.Duration(attempts), time.Second))
	}
	return nil
}

// parseConfBool reads a boolean as torchrun's rendezvous parameters do:
// 1, true, t, yes, y, on or 0, false, f, no, n, off, in any case.
func parseConfBool(v string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "t", "yes", "y", "on":
		return true, nil
	case "0", "false", "f", "no", "n", "off":
		return false, nil
	}
	return false, fmt.Errorf("want true or false")
}
