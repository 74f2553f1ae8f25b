package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/oklog/run"
	"github.com/rs/zerolog"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/internal/filetimer"
	"github.com/gorun/gorun/internal/goodput"
	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/internal/proc"
	"github.com/gorun/gorun/internal/reach"
	"github.com/gorun/gorun/internal/snapshot"
	"github.com/gorun/gorun/internal/snapshot/replica"
	"github.com/gorun/gorun/internal/straggler"
	pythonpkg "github.com/gorun/gorun/python"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdembed"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

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

// node is what one gorun runs for a Launch: its agent and what the agent
// needs around it. start makes the parts, run runs the actors among them
// as a group, close tears them all down in one documented order. A part
// start did not make (a static launch has no etcd; a failed start stops
// half-way) is nil, and close skips it.
type node struct {
	l   *Launch
	rt  Runtime
	log zerolog.Logger // the rendezvous's (component=rendezvous)

	tmpDir      string              // the workers' error files without --log-dir; removed by close
	snapDir     string              // the job's snapshot directory on this node (Launch.Snapshots); removed by close
	replicas    *replica.Server     // serves snapshot copies to and from the other nodes (over etcd); nil: none
	crc         *snapshot.CRCServer // computes the CRCs of the Python workers' saves; nil: none
	stopMetrics func()              // stops serving --metrics-addr
	guard       *proc.Guard         // kills the workers if gorun dies without stopping them

	// Over etcd, in the order start makes them.
	member  *etcdembed.Server  // this node's embedded etcd member, which the others may still need
	dataDir *etcdembed.DataDir // member's data dir
	conn    *etcdstore.Conn
	entry   *etcdstore.Entry // the incarnation this node entered
	store   rendezvous.Store // rdzv's once it joined, and closed with it
	prober  *reach.Listener  // answers reachability probes; nil: none (it could not listen)
	rdzv    *rendezvous.Elastic
	tracker *straggler.Tracker     // the ranks' step compute, for publishStats
	snaps   *snapshotStatus        // the snapshots, for publishStats; nil: off
	goodput func() goodput.Summary // for publishGoodput; nil: none

	agent *elastic.Agent
}

// newNode is the node that runs l in rt, with nothing started yet.
func newNode(l *Launch, rt Runtime) *node {
	return &node{l: l, rt: rt, log: rt.Log.With().Str("component", "rendezvous").Logger()}
}

// start makes the node's parts, each in the order the next one needs
// it: the error-file directory, the metrics server, the guard process
// (which removes the error-file directory, if temporary, and the snapshot
// directory if gorun dies), the snapshot directory, then (over etcd) the embedded member, the connection, the incarnation,
// the store, the prober, the rendezvous, and last the agent. It returns
// the first error; what it made until then stays in n for close.
func (n *node) start(ctx context.Context) error {
	l, rt := n.l, n.rt
	if l.LogDir == "" && (!l.Redirects.IsZero() || !l.Tee.IsZero()) {
		dir, err := os.MkdirTemp("", "gorun-logs-")
		if err != nil {
			return fmt.Errorf("log dir for --redirects/--tee: %w", err)
		}
		l.LogDir = dir
		rt.Log.Warn().Str("log_dir", dir).Msg("--redirects/--tee without --log-dir: worker logs go to a temporary directory")
	}
	errorDir := filepath.Join(l.LogDir, l.RunID)
	if l.LogDir == "" {
		tmp, err := os.MkdirTemp("", "gorun-"+l.RunID+"-")
		if err != nil {
			return fmt.Errorf("directory for worker error files: %w", err)
		}
		n.tmpDir, errorDir = tmp, tmp
	}
	spec := l.AgentSpec(rt, errorDir)
	if _, set := lookupEnv(l.Environ, "OMP_NUM_THREADS"); !set && l.NProcPerNode > 1 {
		rt.Log.Warn().Str("component", "launcher").Msg(ompWarning)
	}
	if l.MetricsAddr != "" {
		snapDir := ""
		if l.Snapshots {
			snapDir = n.snapshotPath()
		}
		stop, err := serveMetrics(l, rt.Log, &spec, snapDir)
		if err != nil {
			return err
		}
		n.stopMetrics = stop
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
			return err
		}
		n.guard, spec.Guard = guard, guard
		if n.tmpDir != "" {
			// gorun killed -9 cannot remove it itself (close does otherwise).
			if err := guard.RemoveAtExit(n.tmpDir); err != nil {
				return err
			}
		}
	}
	if l.Snapshots {
		if err := n.makeSnapshotDir(&spec); err != nil {
			return err
		}
	}
	if l.Rendezvous.Backend == BackendEtcd {
		return n.startElastic(ctx, spec)
	}
	if err := checkMasterPort(l.staticRound()); err != nil {
		return err
	}
	agent, err := elastic.New(spec, &rendezvous.Static{Round: l.staticRound(), MaxFailures: l.MaxRestarts})
	n.agent = agent
	return err
}

// startElastic makes the node's parts over the etcd rendezvous. With an
// embedded plan (SLURM's first nodes, or a c10d endpoint), this node may
// host an etcd member first; close keeps it up until the other nodes
// have left (or lingerForOthers).
func (n *node) startElastic(ctx context.Context, spec elastic.Spec) (err error) {
	l, r := n.l, n.l.Rendezvous
	if n.member, n.dataDir, err = startMember(ctx, l, n.log); err != nil {
		return err
	}
	if n.conn, err = dialRendezvous(ctx, r, n.log); err != nil {
		return err
	}
	entry, err := n.conn.Enter(ctx, l.RunID, r.Launch)
	if err != nil {
		return err
	}
	n.entry = &entry
	n.log.Info().Str("run_id", entry.RunID).Int("incarnation", entry.Number).Msg(entry.String())
	// An etcd outage fails a call only when it outlasts join_timeout.
	if n.store, err = n.conn.NewStore(ctx, entry.Incarnation, r.Timing.LeaseTTL.Std(), etcdstore.WithPatience(r.Timing.JoinTimeout.Std())); err != nil {
		return err
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
		n.log.Warn().Err(err).Msg("this node answers no reachability probes: a network fault that cuts it off costs the other nodes its lease TTL")
	} else {
		n.prober, reachPort = prober, prober.Port()
	}
	if n.rdzv, err = rendezvous.Join(ctx, n.store, rendezvous.Config{
		Self: rendezvous.Member{
			ID: r.NodeID, Host: l.Host, Addr: l.Addr, Preferred: l.NodeRank, NProc: l.NProcPerNode, Reach: reachPort,
		},
		Limits: r.Limits, LastCall: r.Timing.LastCall.Std(), JoinTimeout: r.Timing.JoinTimeout.Std(),
		LeaseTTL: r.Timing.LeaseTTL.Std(),
		FreePort: freePort, Log: n.rt.Log,
	}); err != nil {
		return err
	}
	n.goodput = observeGoodput(&spec, l)
	n.tracker = straggler.NewTracker()
	if spec.Snapshots != nil {
		n.snaps = newSnapshotStatus(spec.Snapshots.Dir)
	}
	observeStragglers(&spec, n.tracker, n.snaps)
	n.agent, err = elastic.New(spec, n.rdzv)
	return err
}

// run runs the node's actors as one group (github.com/oklog/run) until
// each has returned: the agent and, over etcd, the publishers of this
// node's step compute (evicting it when it stays the job's straggler)
// and of its goodput. The first actor to return interrupts the others.
// The agent returns when the job is over for this node, or when ctx ends
// (as SIGTERM); the publishers return only when ctx ends or they are
// interrupted, so an agent they interrupt has seen ctx end as well, and
// is stopped with ctx's own cause. As the agent returns, an embedded
// member is told that the other members stopping is no news any more.
// run returns the agent's outcome and error.
func (n *node) run(ctx context.Context) (out elastic.Outcome, err error) {
	var g run.Group
	actx, stopAgent := context.WithCancelCause(ctx)
	g.Add(func() error {
		out, err = n.agent.Run(actx)
		if n.member != nil {
			n.member.Leaving()
		}
		return err
	}, func(error) { stopAgent(context.Cause(ctx)) })
	if n.rdzv != nil {
		r := n.l.Rendezvous
		sctx, stopStats := context.WithCancel(ctx)
		g.Add(func() error {
			publishStats(sctx, n.store, r.NodeID, n.l.Host, n.tracker, n.snaps, eviction{after: n.l.EvictStragglers.Std(), evict: n.rdzv.Evict},
				n.rt.Log.With().Str("component", "stragglers").Logger())
			return nil
		}, func(error) { stopStats() })
		g.Add(func() error {
			publishGoodput(sctx, n.store, r.NodeID, n.l.Host, n.goodput, n.rt.Log)
			return nil
		}, func(error) { stopStats() })
	}
	// The group's error is the first actor's: the agent's, or nil when ctx
	// ended and a publisher returned first. out and err are the agent's
	// either way.
	_ = g.Run()
	return out, err
}

// leaveBy bounds what a node does with etcd once its agent ended with
// out (see close): keep a finished run's keys, and host an etcd member
// the others may still need. A stop by signal must stay prompt (the
// others are most likely stopping too, and the etcd may have lost its
// quorum).
func leaveBy(out elastic.Outcome) time.Time {
	if out.Signal != nil {
		return time.Now().Add(lingerWhenStopped)
	}
	return time.Now().Add(lingerForOthers)
}

// close tears down what start made, each part once, in this order:
//
//  0. the snapshot replica server and the snapshot directory (the agent
//     has returned: no worker maps its files any more), first, so that
//     the memory is free even when the node is killed while it waits for
//     the others below (srun kills a step's leftover tasks);
//  1. the rendezvous, with its store and lease (this node's leased keys
//     go); then, unless another node hosts the embedded etcd (it may be
//     stopping already), the run's keys are attached to their retention
//     lease if no agent is left, within retainTimeout and by;
//  2. the reachability prober;
//  3. on the node hosting an embedded etcd member: until by, wait for
//     the other nodes to leave, and once they all did, attach the run's
//     keys to their retention lease: the last use of the etcd;
//  4. the connection to etcd;
//  5. the embedded member (given serverCloseTimeout to stop: one whose
//     cluster lost its quorum may not), then its data dir, whether or not
//     the member stopped in time;
//  6. the guard process, the metrics server and the temporary directory
//     of the workers' error files.
//
// by is leaveBy's for a node whose agent ran, the zero time (leave at
// once) for one whose start failed. close returns the errors of the
// member and its data dir; it logs the others.
func (n *node) close(by time.Time) error {
	var errs []error
	if n.replicas != nil {
		if err := n.replicas.Close(); err != nil {
			n.rt.Log.Warn().Err(err).Msg("stopping the snapshot replica server")
		}
	}
	if n.crc != nil {
		if err := n.crc.Close(); err != nil {
			n.rt.Log.Warn().Err(err).Msg("stopping the snapshot CRC socket")
		}
	}
	if n.snapDir != "" {
		if err := os.RemoveAll(n.snapDir); err != nil {
			n.rt.Log.Warn().Err(err).Msg("removing the snapshot directory")
		}
	}
	if n.rdzv != nil {
		if err := n.rdzv.Close(); err != nil {
			// The release of this node's lease only spares the others its
			// TTL, and it can fail after it took effect: the node hosting
			// the embedded etcd stops it once every node's keys are gone,
			// which may be before this node hears etcd's answer. Not a
			// failure of the job.
			n.log.Warn().Err(err).Msg("the rendezvous did not close cleanly: the other nodes see this one leave when its lease runs out at the latest")
		}
		if n.l.Rendezvous.Embedded == nil || n.member != nil {
			ctx, cancel := n.leavingCtx(earliest(by, time.Now().Add(retainTimeout)))
			if err := n.conn.RetainIfDeserted(ctx, n.entry.Incarnation); err != nil {
				n.log.Warn().Err(err).AnErr("cause", context.Cause(ctx)).Msg("the run's keys stay in etcd until its run id starts again")
			}
			cancel()
		}
	} else if n.store != nil {
		_ = n.store.Close() // the join failed: the store is not the rendezvous's
	}
	if n.prober != nil {
		_ = n.prober.Close()
	}
	if n.member != nil && n.entry != nil {
		ctx, cancel := n.leavingCtx(by)
		if err := n.conn.AwaitDeparture(ctx, n.entry.Incarnation); err != nil {
			n.log.Warn().Err(err).AnErr("cause", context.Cause(ctx)).Msg("other nodes still registered when this node's etcd member stopped")
		} else if err := n.conn.RetainIfDeserted(ctx, n.entry.Incarnation); err != nil {
			n.log.Warn().Err(err).AnErr("cause", context.Cause(ctx)).Msg("the run's keys stay in etcd until its run id starts again")
		}
		cancel()
	}
	if n.conn != nil {
		_ = n.conn.Close()
	}
	if n.member != nil {
		errs = append(errs, closeWithin(n.member.Close, serverCloseTimeout, n.log), n.dataDir.Release())
	}
	if n.guard != nil {
		if err := n.guard.Close(); err != nil {
			n.rt.Log.Warn().Err(err).Msg("guard process")
		}
	}
	if n.stopMetrics != nil {
		n.stopMetrics()
	}
	if n.tmpDir != "" {
		_ = os.RemoveAll(n.tmpDir)
	}
	return errors.Join(errs...)
}

// leavingCtx bounds what close does with the etcd: until by and, on a
// node hosting an embedded member, only while that member's cluster has a
// quorum (etcdembed.Server.UntilQuorumLost). The other nodes of a
// finished job stop their members as they leave; once too few run, no
// request can finish, and waiting for by would only delay the exit (by
// 30 s, lingerForOthers, when the job had lost a node's member too).
func (n *node) leavingCtx(by time.Time) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithDeadline(context.Background(), by)
	if n.member == nil {
		return ctx, cancel
	}
	ctx, stop := n.member.UntilQuorumLost(ctx)
	return ctx, func() { stop(); cancel() }
}

// earliest is the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// startMember starts the embedded etcd member l's plan gives this node,
// with its data dir; none (nil, nil, nil) when the plan gives it none,
// or when it is a c10d endpoint's guessed host whose port is taken: this
// node is then a client, as under torchrun.
func startMember(ctx context.Context, l *Launch, log zerolog.Logger) (*etcdembed.Server, *etcdembed.DataDir, error) {
	r := l.Rendezvous
	if r.Embedded == nil || r.Member == nil {
		return nil, nil, nil
	}
	m := *r.Member
	dataDir, err := etcdembed.ClaimDataDir(scratchDir(os.Getenv), dataDirName(l.RunID, m))
	if err != nil {
		return nil, nil, fmt.Errorf("embedded etcd on %s: %w", m.Host, err)
	}
	cfg := r.Embedded.ServerConfig(m, ClusterToken(l.RunID, r.Generation, l.Secret), dataDir.Path(), log)
	// The other members may be slow to start (a busy node, a late
	// srun task): wait for them as long as for a round to form.
	cfg.StartTimeout = r.Timing.JoinTimeout.Std()
	if r.Auth != "" {
		cfg.Secret = l.Secret // the agents' credentials come from it
	}
	server, err := etcdembed.Start(ctx, cfg)
	switch {
	case err != nil && r.clientFallback(err):
		log.Info().Err(err).Strs("endpoints", r.Endpoints).Msg("the c10d endpoint's port is taken (another agent of this job on this machine hosts it?): this node is a client, as under torchrun")
		if err := dataDir.Release(); err != nil {
			log.Warn().Err(err).Msg("removing the unused etcd data dir")
		}
		return nil, nil, nil
	case err != nil:
		err = errors.Join(err, dataDir.Release())
		if r.Hosting != "" {
			err = fmt.Errorf("%w (%s; agents sharing a machine: give each its own --local-addr, or --rdzv-conf %s=false to all but one)",
				err, r.Hosting, confIsHost)
		}
		return nil, nil, fmt.Errorf("embedded etcd on %s: %w", m.Host, err)
	}
	log.Info().Strs("endpoints", server.Endpoints()).Bool("auth", !cfg.Secret.IsZero()).Msg("hosting an embedded etcd member")
	return server, dataDir, nil
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

// DefaultShmDir is where the job's snapshot directory is made when
// Runtime.ShmDir is "": a tmpfs on every Linux machine, so that the
// workers' snapshots are memory that outlives the workers.
const DefaultShmDir = "/dev/shm"

// snapshotPath is the job's snapshot directory on this node:
// <shm>/gorun-<run id>-<pid>.
func (n *node) snapshotPath() string {
	shm := n.rt.ShmDir
	if shm == "" {
		shm = DefaultShmDir
	}
	return filepath.Join(shm, fmt.Sprintf("gorun-%s-%d", n.l.RunID, os.Getpid()))
}

// SweepSnapshotDirs removes from shm the snapshot directories of gorun
// processes that are gone (gorun-<run id>-<pid> holding the extracted
// python/gorun, whose pid no longer runs): a node killed whole, or a
// gorun SIGKILLed with its guard, cannot remove its own, and its memory
// would stay taken until the machine restarts. A directory it cannot
// read or remove is left, logged.
func SweepSnapshotDirs(shm string, log zerolog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(shm, "gorun-*-*"))
	for _, dir := range dirs {
		i := strings.LastIndexByte(dir, '-')
		pid, err := strconv.Atoi(dir[i+1:])
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "python", "gorun")); err != nil {
			continue // not a snapshot directory of gorun's
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			continue // its gorun still runs (or is another user's)
		}
		if err := os.RemoveAll(dir); err != nil {
			log.Warn().Err(err).Str("dir", dir).Msg("cannot remove the snapshot directory of a gorun that is gone")
			continue
		}
		log.Info().Str("component", "launcher").Str("dir", dir).Msg("removed the snapshot directory of a gorun that is gone")
	}
}

// makeSnapshotDir makes the job's snapshot directory on this node,
// <shm>/gorun-<run id>-<pid> (mode 0700: the job's user alone), extracts
// the gorun Python package into its python/ and gives spec's workers
// both (GORUN_SNAPSHOT_DIR, and python/ first on PYTHONPATH); the guard,
// if any, removes it if gorun dies. It makes the durable directory
// (--snapshot-durable), if any, first. A directory that cannot be made is
// an error that names it and says what to do.
func (n *node) makeSnapshotDir(spec *elastic.Spec) error {
	l, shm := n.l, n.rt.ShmDir
	if shm == "" {
		shm = DefaultShmDir
	}
	if d := l.SnapshotDurable; d != nil {
		if err := os.MkdirAll(d.Dir, 0o700); err != nil {
			return fmt.Errorf("--snapshot-durable %s: %w (give a directory on storage every node shares that gorun can make and write, or drop the flag)", d.Dir, err)
		}
	}
	SweepSnapshotDirs(shm, n.rt.Log)
	dir := n.snapshotPath()
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("snapshot directory %s: %w (the workers' snapshots live in a tmpfs at %s: make it writable, or turn snapshots off with --snapshots=false)", dir, err, shm)
	}
	n.snapDir = dir
	if err := n.guard.RemoveAtExit(dir); err != nil {
		return err
	}
	python := filepath.Join(dir, "python")
	if err := pythonpkg.Extract(python); err != nil {
		return fmt.Errorf("snapshot directory %s: %w", dir, err)
	}
	env := setEnv(spec.Environ, snapshot.EnvDir, dir)
	// The workers' saves ask the agent for their CRCs (ten times zlib's
	// speed here); without the socket they compute them themselves.
	if crc, err := snapshot.ServeCRC(dir); err != nil {
		n.rt.Log.Warn().Str("component", "launcher").Err(err).Msg("the workers compute their snapshots' CRCs themselves")
	} else {
		n.crc = crc
		env = setEnv(env, snapshot.EnvCRC, crc.Path())
	}
	path := python
	if old, ok := lookupEnv(env, "PYTHONPATH"); ok && old != "" {
		path += string(os.PathListSeparator) + old
	}
	spec.Environ = setEnv(env, "PYTHONPATH", path)
	if l.WarmWorkers && !spec.InPlace {
		spec.Warm = warmCommand(spec.Command, filepath.Join(python, pythonpkg.Package, "_warm.py"))
		spec.WarmDelay = WarmDelay
	}
	spec.Snapshots = &elastic.Snapshots{Dir: dir, Node: firstNonEmpty(l.Rendezvous.NodeID, l.Host), Replicas: l.SnapshotReplicas}
	if d := l.SnapshotDurable; d != nil {
		spec.Snapshots.Durable = &elastic.Durable{Dir: d.Dir, Every: d.Every, Keep: d.Keep}
	}
	if l.Rendezvous.Backend == BackendEtcd {
		// Nodes that may lose one another copy and fetch snapshots. One
		// that cannot listen on its address still runs (as it runs without
		// answering reachability probes): the failure is the agent's to
		// report once it joined the job, so that every node hears of it.
		if t, err := n.serveReplicas(dir); err != nil {
			n.rt.Log.Warn().Str("component", "launcher").Err(err).Msg("this node serves no snapshot copies: its ranks' snapshots are not copied to other nodes, and it keeps none of theirs")
		} else {
			n.replicas, spec.Snapshots.Transfer = t.Server, t
		}
	}
	n.rt.Log.Info().Str("component", "launcher").Str("dir", dir).Int("replicas", l.SnapshotReplicas).Bool("warm_workers", spec.Warm != nil).Msg("workers' snapshots in memory")
	return nil
}
