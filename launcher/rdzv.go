package launcher

import (
	"fmt"
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
	// Generation is SLURM_RESTART_COUNT: a requeued job (a larger one,
	// same run id) starts a new incarnation of its run.
	Generation int                    `json:"generation,omitempty"`
	ID         string                 `json:"id"`
	NodeID     string                 `json:"node_id,omitempty"` // unique per agent process
	Conf       map[string]string      `json:"conf,omitempty"`
	Client     etcdstore.ClientConfig `json:"-"`
	// Launch tells this launch of the run id from others (etcdstore.Enter):
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
	confTimeout     = "timeout" // torchrun's name for join_timeout
	confMaxChanges  = "max_membership_changes"
	confIsHost      = "is_host" // torchrun's: whether this node hosts the c10d endpoint
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
	etcdstore.ConfCACert, etcdstore.ConfCert, etcdstore.ConfKey, etcdstore.ConfUser,
	etcdstore.ConfPassword, etcdstore.ConfDialTimeout, etcdstore.ConfConnectTimeout,
}

// chooseBackend picks static or etcd from what the user asked for:
// --standalone and one-node jobs are static; a SLURM job of several nodes
// is elastic over an embedded etcd unless an endpoint is given; elsewhere
// an endpoint, an explicit etcd backend or a MIN:MAX range mean etcd.
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
	case underSLURM || opts.RdzvEndpoint != "":
		return BackendEtcd, nil
	case elastic:
		return "", usagef("--nnodes=%s: an elastic range needs an etcd: give --rdzv-endpoint HOST:PORT (start one with gorun rendezvous serve)", opts.NNodes)
	case !rankKnown:
		return "", usagef("--nnodes=%d without SLURM: give each node its --node-rank (0..%d) and --master-addr, or --rdzv-endpoint of an etcd", l.MinNodes, l.MinNodes-1)
	}
	return BackendStatic, nil
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
	conf := r.Conf
	for k := range conf {
		if !slices.Contains(knownConf, k) {
			known := slices.Sorted(slices.Values(knownConf))
			return usagef("--rdzv-conf: unknown key %q (known: %s)", k, strings.Join(known, ", "))
		}
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
	if _, set := conf[etcdstore.ConfConnectTimeout]; c10d && !set {
		// Waiting for the node that hosts the endpoint to come up is part
		// of waiting for the round to form, which join_timeout bounds.
		r.Client.Patience = r.Timing.JoinTimeout.Std()
	}
	r.Limits = rendezvous.Limits{MinNodes: l.MinNodes, MaxNodes: l.MaxNodes, MaxFailures: l.MaxRestarts, MaxChanges: defaultMaxChanges}
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

// parseConfDuration reads "30s", "1m" or "30" (seconds).
func parseConfDuration(v string) (time.Duration, error) {
	if d, err := time.ParseDuration(v); err == nil {
		return d, nil
	}
	secs, err := strconv.ParseFloat(v, 64)
	return time.Duration(secs * float64(time.Second)), err
}
