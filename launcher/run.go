package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/internal/agentmetrics"
	"github.com/gorun/gorun/internal/filetimer"
	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/internal/proc"
	"github.com/gorun/gorun/internal/reach"
	"github.com/gorun/gorun/internal/straggler"
	"github.com/gorun/gorun/internal/workerlog"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdembed"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// planErrorDir stands for the temporary directory of the error files in
// `gorun plan`, which creates nothing.
const planErrorDir = "$TMPDIR/gorun-XXXX"

// lingerForOthers bounds how long a node hosting an embedded etcd member
// keeps it up after its own work is done, so that the other nodes can
// read the outcome and leave.
const lingerForOthers = 30 * time.Second

// serverCloseTimeout bounds the stop of an embedded etcd member: a member
// whose cluster lost its quorum (the other members' nodes stopped first)
// may not stop cleanly, and gorun must still exit.
const serverCloseTimeout = 5 * time.Second

// closeWithin runs closeFn, giving up (with a warning) after d.
func closeWithin(closeFn func() error, d time.Duration, log zerolog.Logger) error {
	done := make(chan error, 1)
	go func() { done <- closeFn() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		log.Info().Dur("after", d).Msg("embedded etcd member still stopping (its cluster lost its quorum as the other nodes left): leaving it to gorun's exit")
		return nil
	}
}

// retainTimeout bounds the last agent's attaching of the run's keys to
// their retention lease as it leaves (etcdstore.Conn.RetainIfDeserted).
const retainTimeout = 5 * time.Second

// lingerWhenStopped is that bound when a signal stopped this node: the
// stop must stay prompt, and the other nodes are most likely stopping too.
const lingerWhenStopped = 3 * time.Second

// ompWarning is torchrun's, when it sets OMP_NUM_THREADS=1 for workers
// that share a node.
const ompWarning = "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, " +
	"to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed."

// Runtime is what running a Launch needs from the process around it.
type Runtime struct {
	Stdout, Stderr io.Writer        // gorun's console
	Stdin          *os.File         // shared by the workers, as torchrun's share its stdin; nil: /dev/null
	Signals        <-chan os.Signal // signals gorun caught
	// GuardCommand starts the guard process that kills the workers if
	// gorun dies without stopping them (proc.RunGuard); nil: no guard.
	GuardCommand []string
	Log          zerolog.Logger
}

// staticRound is the round of a static launch, and what `gorun plan`
// shows for an etcd one (whose master is only known once a round forms).
func (l *Launch) staticRound() rendezvous.Round {
	rank := max(l.NodeRank, 0)
	return rendezvous.Round{
		NodeRank: rank, NumNodes: l.firstNodes(), FirstRank: rank * l.NProcPerNode,
		WorldSize: l.WorldSize(), MasterAddr: l.MasterAddr, MasterPort: l.MasterPort,
	}
}

// AgentSpec is the agent's view of l; errorDir holds the workers' error
// files when there is no log dir.
func (l *Launch) AgentSpec(rt Runtime, errorDir string) elastic.Spec {
	spec := elastic.Spec{
		RunID: l.RunID, Host: l.Host, LocalWorkers: l.NProcPerNode, Role: l.Role,
		Command: l.Command, Environ: l.Environ, MaxRestarts: l.MaxRestarts,
		TermTimeout: l.TermTimeout.Std(), HeartbeatTimeout: l.Heartbeat.Std(), ErrorDir: errorDir, Report: rt.Stderr,
		Signals: rt.Signals, Log: rt.Log, Stdin: rt.Stdin,
		WorkerGPUs: l.WorkerGPUs, VirtualLocalRank: l.VirtualLocalRank, WorkerCPUs: l.WorkerCPUs,
		Logs: workerlog.Config{
			Dir: l.LogDir, Redirects: l.Redirects, Tee: l.Tee, LocalRanksFilter: l.ShowRanks,
			Stdout: rt.Stdout, Stderr: rt.Stderr, TailLines: 20,
			Role: l.Role, PrefixTemplate: l.PrefixTemplate, FlushAfter: workerlog.DefaultFlushAfter,
		},
	}
	// Every worker of a train.toml job gets the heartbeat channel
	// (Spec.InPlace implies it). A worker waits for its next round at
	// most as long as the round change may take: the lease TTL for a
	// node to count as lost, then the join timeout for the round to form.
	spec.InPlace = l.InPlace
	if l.Rendezvous.Backend == BackendEtcd {
		spec.AwaitTimeout = l.Rendezvous.Timing.LeaseTTL.Std() + l.Rendezvous.Timing.JoinTimeout.Std()
		// A node that is gone has lost its lease by then (leases are
		// coarse: one may outlive its TTL by half); a world broken with no
		// node lost re-forms in place.
		spec.ReformAfter = 2 * l.Rendezvous.Timing.LeaseTTL.Std()
	}
	return spec
}

// Run runs l on this node until the job ends, and returns how it ended.
// ctx ending stops the workers as SIGTERM does. Temporary files (error
// files without --log-dir) are removed before it returns.
func Run(ctx context.Context, l *Launch, rt Runtime) (elastic.Outcome, error) {
	if l.LogDir == "" && (!l.Redirects.IsZero() || !l.Tee.IsZero()) {
		dir, err := os.MkdirTemp("", "gorun-logs-")
		if err != nil {
			return elastic.Outcome{ExitCode: 1}, fmt.Errorf("log dir for --redirects/--tee: %w", err)
		}
		l.LogDir = dir
		rt.Log.Warn().Str("log_dir", dir).Msg("--redirects/--tee without --log-dir: worker logs go to a temporary directory")
	}
	errorDir := filepath.Join(l.LogDir, l.RunID)
	if l.LogDir == "" {
		tmp, err := os.MkdirTemp("", "gorun-"+l.RunID+"-")
		if err != nil {
			return elastic.Outcome{ExitCode: 1}, fmt.Errorf("directory for worker error files: %w", err)
		}
		defer os.RemoveAll(tmp)
		errorDir = tmp
	}
	spec := l.AgentSpec(rt, errorDir)
	if _, set := lookupEnv(l.Environ, "OMP_NUM_THREADS"); !set && l.NProcPerNode > 1 {
		rt.Log.Warn().Str("component", "launcher").Msg(ompWarning)
	}
	if l.MetricsAddr != "" {
		stop, err := serveMetrics(l, rt.Log, &spec)
		if err != nil {
			return elastic.Outcome{ExitCode: 1}, err
		}
		defer stop()
	}
	if v, _ := lookupEnv(l.Environ, filetimer.EnableEnv); v == "1" {
		// torchrun's watchdog: serve torch's FileTimerClient on a FIFO the
		// workers learn from TORCHELASTIC_TIMER_FILE.
		path, set := lookupEnv(l.Environ, filetimer.PathEnv)
		if !set || path == "" {
			path = filepath.Join(os.TempDir(), fmt.Sprintf("gorun-watchdog-%s-%d", l.RunID, os.Getpid()))
			spec.Environ = append(append([]string(nil), spec.Environ...), filetimer.PathEnv+"="+path)
		}
		spec.TimerFile = path
	}
	if rt.GuardCommand != nil {
		guard, err := proc.StartGuard(rt.GuardCommand)
		if err != nil {
			return elastic.Outcome{ExitCode: 1}, err
		}
		defer func() {
			if err := guard.Close(); err != nil {
				rt.Log.Warn().Err(err).Msg("guard process")
			}
		}()
		spec.Guard = guard
	}
	if l.Rendezvous.Backend == BackendEtcd {
		return runElastic(ctx, l, rt, spec)
	}
	if err := checkMasterPort(l.staticRound()); err != nil {
		return elastic.Outcome{ExitCode: 1}, err
	}
	agent, err := elastic.New(spec, &rendezvous.Static{Round: l.staticRound(), MaxFailures: l.MaxRestarts})
	if err != nil {
		return elastic.Outcome{ExitCode: 1}, err
	}
	return agent.Run(ctx)
}

// checkMasterPort fails, naming the port, when round r's worker rank 0
// runs on this node and its MASTER_PORT is taken here: the workers'
// store would fail to bind it, deep in every worker's traceback. It
// checks at the launch only; a port taken later fails the workers.
func checkMasterPort(r rendezvous.Round) error {
	if r.NodeRank != 0 || r.MasterPort <= 0 {
		return nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(r.MasterPort)))
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("MASTER_PORT %d is already in use on this node, where worker rank 0 hosts the workers' store: give another --master-port, or stop what holds it", r.MasterPort)
	}
	if err != nil {
		return nil // not ours to judge (no permission, no such address): the store reports it
	}
	return ln.Close()
}

// serveMetrics serves the agent's Prometheus metrics at l.MetricsAddr
// and makes them spec's observer; the returned func stops serving.
func serveMetrics(l *Launch, log zerolog.Logger, spec *elastic.Spec) (func(), error) {
	m, err := agentmetrics.New(agentmetrics.Config{RunID: l.RunID, Node: l.Host})
	if err != nil {
		return nil, err
	}
	srv, err := agentmetrics.Serve(l.MetricsAddr, m.Handler())
	if err != nil {
		return nil, err
	}
	log = log.With().Str("component", "metrics").Logger()
	log.Info().Str("addr", srv.Addr().String()).Msg("serving Prometheus metrics at /metrics")
	spec.Observer = m
	return func() {
		if err := srv.Close(); err != nil {
			log.Warn().Err(err).Msg("stopping the metrics server")
		}
	}, nil
}

// runElastic runs the agent over the etcd rendezvous. With an embedded
// plan (SLURM's first nodes, or a c10d endpoint), this node may host an
// etcd member first; it keeps it up until the other nodes have left (or
// lingerForOthers).
func runElastic(ctx context.Context, l *Launch, rt Runtime, spec elastic.Spec) (out elastic.Outcome, err error) {
	r := l.Rendezvous
	log := rt.Log.With().Str("component", "rendezvous").Logger()
	var server *etcdembed.Server // this node's embedded etcd member, which the others may still need
	if r.Embedded != nil && r.Member != nil {
		m := *r.Member
		dataDir, err := etcdembed.ClaimDataDir(scratchDir(os.Getenv), dataDirName(l.RunID, m))
		if err != nil {
			return elastic.Outcome{ExitCode: 1}, fmt.Errorf("embedded etcd on %s: %w", m.Host, err)
		}
		cfg := r.Embedded.ServerConfig(m, ClusterToken(l.RunID, r.Generation, l.Secret), dataDir.Path(), log)
		// The other members may be slow to start (a busy node, a late
		// srun task): wait for them as long as for a round to form.
		cfg.StartTimeout = r.Timing.JoinTimeout.Std()
		if r.Auth != "" {
			cfg.Secret = l.Secret // the agents' credentials come from it
		}
		server, err = etcdembed.Start(ctx, cfg)
		if err != nil && r.clientFallback(err) {
			log.Info().Err(err).Strs("endpoints", r.Endpoints).Msg("the c10d endpoint's port is taken (another agent of this job on this machine hosts it?): this node is a client, as under torchrun")
			if err := dataDir.Release(); err != nil {
				log.Warn().Err(err).Msg("removing the unused etcd data dir")
			}
		} else if err != nil {
			err = errors.Join(err, dataDir.Release())
			if r.Hosting != "" {
				err = fmt.Errorf("%w (%s; agents sharing a machine: give each its own --local-addr, or --rdzv-conf %s=false to all but one)",
					err, r.Hosting, confIsHost)
			}
			return elastic.Outcome{ExitCode: 1}, fmt.Errorf("embedded etcd on %s: %w", m.Host, err)
		} else {
			log.Info().Strs("endpoints", server.Endpoints()).Bool("auth", !cfg.Secret.IsZero()).Msg("hosting an embedded etcd member")
			// The data dir goes even when the member does not stop in time.
			defer func() { err = errors.Join(err, closeWithin(server.Close, serverCloseTimeout, log), dataDir.Release()) }()
		}
	}
	conn, err := dialRendezvous(ctx, r, log)
	if err != nil {
		return elastic.Outcome{ExitCode: 1}, err
	}
	defer conn.Close()
	entry, err := conn.Enter(ctx, l.RunID, r.Launch)
	if err != nil {
		return elastic.Outcome{ExitCode: 1}, err
	}
	log.Info().Str("run_id", entry.RunID).Int("incarnation", entry.Number).Msg(entry.String())
	// leaveBy bounds what this node does with etcd once its agent is done:
	// keep a finished run's keys, and host an etcd member the others may
	// still need. A stop by signal must stay prompt (the others are most
	// likely stopping too, and the etcd may have lost its quorum).
	var leaveBy time.Time
	if server != nil {
		defer func() {
			ctx, cancel := context.WithDeadline(context.Background(), leaveBy)
			defer cancel()
			if err := conn.AwaitDeparture(ctx, entry.Incarnation); err != nil {
				log.Warn().Err(err).Msg("other nodes still registered when this node's etcd member stopped")
			} else if err := conn.RetainIfDeserted(ctx, entry.Incarnation); err != nil {
				// Everyone left, and this member still runs: the last use of the etcd.
				log.Warn().Err(err).Msg("the run's keys stay in etcd until its run id starts again")
			}
		}()
	}
	// An etcd outage fails a call only when it outlasts join_timeout.
	store, err := conn.NewStore(ctx, entry.Incarnation, r.Timing.LeaseTTL.Std(), etcdstore.WithPatience(r.Timing.JoinTimeout.Std()))
	if err != nil {
		return elastic.Outcome{ExitCode: 1}, err
	}
	// The agent answers reachability probes on its node's address, so
	// that a network fault between nodes that costs no lease can be told
	// from a slow process, and a node left out for it can tell when it may
	// come back (rendezvous.Unreachable).
	// An address it cannot listen on is reported once the agent joined
	// the job (the port it offers the master is on the same address), so
	// that every node hears of it; meanwhile it answers no probes.
	reachPort := 0
	if prober, err := reach.Listen(l.Addr); err != nil {
		log.Warn().Err(err).Msg("this node answers no reachability probes: a network fault that cuts it off costs the other nodes its lease TTL")
	} else {
		defer prober.Close()
		reachPort = prober.Port()
	}
	rdzv, err := rendezvous.Join(ctx, store, rendezvous.Config{
		Self: rendezvous.Member{
			ID: r.NodeID, Host: l.Host, Addr: l.Addr, Preferred: l.NodeRank, NProc: l.NProcPerNode, Reach: reachPort,
		},
		Limits: r.Limits, LastCall: r.Timing.LastCall.Std(), JoinTimeout: r.Timing.JoinTimeout.Std(),
		LeaseTTL: r.Timing.LeaseTTL.Std(),
		FreePort: freePort, Log: rt.Log,
	})
	if err != nil {
		_ = store.Close()
		return elastic.Outcome{ExitCode: 1}, err
	}
	defer func() {
		err = errors.Join(err, rdzv.Close())
		by := time.Now().Add(retainTimeout)
		if leaveBy.Before(by) {
			by = leaveBy
		}
		ctx, cancel := context.WithDeadline(context.Background(), by)
		defer cancel()
		if r.Embedded != nil && server == nil {
			return // the node hosting the embedded etcd does it once everyone left; it may be stopping already
		}
		if err := conn.RetainIfDeserted(ctx, entry.Incarnation); err != nil {
			log.Warn().Err(err).Msg("the run's keys stay in etcd until its run id starts again")
		}
	}()
	goodputOf := observeGoodput(&spec, l)
	tracker := straggler.NewTracker()
	observeStragglers(&spec, tracker)
	agent, err := elastic.New(spec, rdzv)
	if err != nil {
		return elastic.Outcome{ExitCode: 1}, err
	}
	statsCtx, stopStats := context.WithCancel(ctx)
	statsDone := make(chan struct{})
	go func() {
		defer close(statsDone)
		publishStats(statsCtx, store, r.NodeID, l.Host, tracker, eviction{after: l.EvictStragglers.Std(), evict: rdzv.Evict},
			rt.Log.With().Str("component", "stragglers").Logger())
	}()
	goodputDone := make(chan struct{})
	go func() {
		defer close(goodputDone)
		publishGoodput(statsCtx, store, r.NodeID, l.Host, goodputOf, rt.Log)
	}()
	out, err = agent.Run(ctx)
	if server != nil {
		server.Leaving() // the others' members stopping is no news now
	}
	stopStats()
	<-statsDone
	<-goodputDone
	leaveBy = time.Now().Add(lingerForOthers)
	if out.Signal != nil {
		leaveBy = time.Now().Add(lingerWhenStopped)
	}
	return out, err
}

// dialRendezvous connects to r's etcd. When the job secret gives the
// credentials, a refusal says so, and an etcd that gorun does not embed
// and that turns out to have no authentication is worth a warning: any
// user who reaches it can read and change the job's keys.
func dialRendezvous(ctx context.Context, r Rendezvous, log zerolog.Logger) (*etcdstore.Conn, error) {
	conn, err := etcdstore.Connect(ctx, r.Client)
	if err != nil {
		if r.Auth != "" && etcdstore.CredentialsRefused(err) {
			err = fmt.Errorf("%w (authenticating with the %s: does this etcd run with the same %s? for an etcd gorun does not run, give --rdzv-conf %s=,%s=)",
				err, r.Auth, jobsecret.EnvVar, etcdstore.ConfUser, etcdstore.ConfPassword)
		}
		return nil, err
	}
	if r.Auth == "" || r.Embedded != nil {
		return conn, nil
	}
	actx, cancel := context.WithTimeout(ctx, r.Client.DialTimeout+etcdstore.DefaultDialTimeout)
	defer cancel()
	if conn.Unauthenticated(actx) {
		log.Warn().Strs("endpoints", r.Endpoints).Msg("the rendezvous etcd does not authenticate: any user who reaches it can read and change this job's keys " +
			"(start gorun rendezvous serve with the job secret, or give an etcd with TLS and users --rdzv-conf)")
	}
	return conn, nil
}

// PlanEnv fills WorkerEnv: the full environment of each local worker.
func (l *Launch) PlanEnv() {
	l.WorkerEnv = nil
	for _, w := range l.Workers {
		l.WorkerEnv = append(l.WorkerEnv, w.Environ(l.Environ))
	}
}

// lookupEnv finds key in a KEY=VALUE environment.
func lookupEnv(environ []string, key string) (string, bool) {
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}
