package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/elastic/agentmetrics"
	"github.com/gorun/gorun/internal/workerlog"
	"github.com/gorun/gorun/rendezvous"
)

// planErrorDir stands for the temporary directory of the error files in
// `gorun plan`, which creates nothing.
const planErrorDir = "$TMPDIR/gorun-XXXX"

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
	// ShmDir is the tmpfs the job's snapshot directory is made in;
	// "": DefaultShmDir.
	ShmDir string
	Log    zerolog.Logger
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
	n := newNode(l, rt)
	if err := n.start(ctx); err != nil {
		return elastic.Outcome{ExitCode: 1}, errors.Join(err, n.close(time.Time{}))
	}
	out, err := n.run(ctx)
	return out, errors.Join(err, n.close(leaveBy(out)))
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
// and makes them spec's observer; snapDir is the job's snapshot directory
// ("": none). The returned func stops serving.
func serveMetrics(l *Launch, log zerolog.Logger, spec *elastic.Spec, snapDir string) (func(), error) {
	m, err := agentmetrics.New(agentmetrics.Config{RunID: l.RunID, Node: l.Host, SnapshotDir: snapDir})
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
