package launcher

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Options is what the user asked for, as given on the command line or in
// GORUN_* / PET_* variables, before anything is looked up.
type Options struct {
	NProcPerNode     string        // N, or auto | gpu | cpu
	NNodes           string        // N or MIN:MAX; "" takes SLURM's or 1
	NodeRank         int           // -1: from SLURM, or 0 on one node
	MasterAddr       string        // "": first node of the step, or 127.0.0.1
	MasterPort       int           // 0: derived from the SLURM job id, or a free port
	Standalone       bool          // one node, nothing to rendezvous with
	RdzvBackend      string        // etcd | static | c10d (with an endpoint and several nodes: etcd hosted at it; else static)
	RdzvEndpoint     string        // HOST[:PORT]
	RdzvID           string        // run id; "": SLURM_JOB_ID, or a fresh one on one node
	RdzvConf         string        // k=v,...
	MaxRestarts      int           // worker-failure restarts before the job fails
	Role             string        // ROLE_NAME
	LogDir           string        // per-rank output files under it
	Tee              string        // torchrun --tee
	Redirects        string        // torchrun --redirects
	LocalRanksFilter string        // local ranks shown on the console
	NoPython         bool          // the entrypoint is a program, not a Python script
	TermTimeout      time.Duration // grace between the stop signal and SIGKILL
	HeartbeatTimeout time.Duration // a worker silent this long after a heartbeat is hung; 0: off
	EvictStragglers  time.Duration // a node whose rank stays the job's straggler this long leaves the job; 0: off
	NodeName         string        // host name this node announces; "" is SLURMD_NODENAME or the host name
	LocalAddr        string        // address other nodes reach this node at; "" is the node name
	JobSecretFile    string        // file holding the job secret (else GORUN_JOB_SECRET; see resolveSecret)
	MetricsAddr      string        // HOST:PORT the agent serves Prometheus /metrics on; "": none
	// NoSnapshots turns the workers' snapshots off: no per-job directory,
	// no GORUN_SNAPSHOT_* variables, no gorun package on PYTHONPATH.
	NoSnapshots bool
	// WarmWorkers keeps a warm Python worker per local rank, which
	// imported torch ahead of the next round (elastic.Spec.Warm).
	WarmWorkers      bool
	SnapshotReplicas int // copies of each rank's snapshots on other nodes (--snapshot-replicas); 0: none
	// SnapshotDurable is a directory on storage every node shares where
	// every SnapshotDurableEvery-th snapshot of each rank is also copied,
	// the newest SnapshotDurableKeep complete steps kept
	// (--snapshot-durable*); "": none.
	SnapshotDurable      string
	SnapshotDurableEvery int
	SnapshotDurableKeep  int

	// torchrun's flags that gorun accepts for a drop-in command line
	// (docs/torchrun.md, "torchrun flags and variables"); checkCompat validates them.

	Module           bool          // -m: the entrypoint is a Python module, run as python -u -m MODULE
	RunPath          bool          // --run-path: the script runs through runpy.run_path; wins over NoPython and Module
	MonitorInterval  time.Duration // torchrun's polling period; gorun does not poll (0 or more)
	StartMethod      string        // spawn | fork | forkserver; no effect (each worker is a new program, as for a torchrun script)
	EventLogHandler  string        // null | console | dynamic_rendezvous; no effect
	LogsSpecs        string        // a torchrun.logs_specs plugin name; gorun has no Python plugins: noted as ignored
	NumaBinding      string        // "" | node | socket | exclusive | core-complex
	SignalsToHandle  string        // comma-separated signal names, torchrun's SIGTERM,SIGINT,SIGHUP,SIGQUIT by default
	VirtualLocalRank bool          // LOCAL_RANK=0 and one GPU per worker, as torchrun's --virtual-local-rank
	DupStdoutFilters string        // torchrun's --duplicate-stdout-filters, comma-separated (",," a comma)
	DupStderrFilters string        // torchrun's --duplicate-stderr-filters

	Entrypoint string
	Args       []string
}

// UsageError is an error in what the user asked for: the CLI prints it on
// one line and exits with status 2.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

func usagef(format string, args ...any) error {
	return &UsageError{Msg: fmt.Sprintf(format, args...)}
}

// ParseNNodes parses --nnodes: "N" or "MIN:MAX" with 1 <= MIN <= MAX.
func ParseNNodes(s string) (min, max int, err error) {
	lo, hi, isRange := strings.Cut(s, ":")
	if !isRange {
		hi = lo
	}
	min, err1 := strconv.Atoi(strings.TrimSpace(lo))
	max, err2 := strconv.Atoi(strings.TrimSpace(hi))
	switch {
	case err1 != nil || err2 != nil:
		return 0, 0, usagef("--nnodes=%s: want a number of nodes N or a range MIN:MAX", s)
	case min < 1:
		return 0, 0, usagef("--nnodes=%s: need at least 1 node", s)
	case min > max:
		return 0, 0, usagef("--nnodes=%s: MIN %d is larger than MAX %d", s, min, max)
	}
	return min, max, nil
}

// ParseRdzvConf parses --rdzv-conf "k=v,k2=v2" into a map. Keys must be
// unique and non-empty.
func ParseRdzvConf(s string) (map[string]string, error) {
	conf := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return conf, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, usagef("--rdzv-conf=%s: %q is not key=value", s, kv)
		}
		if _, dup := conf[k]; dup {
			return nil, usagef("--rdzv-conf=%s: key %q given twice", s, k)
		}
		conf[k] = strings.TrimSpace(v)
	}
	return conf, nil
}

// checkMetricsAddr wants --metrics-addr as HOST:PORT (HOST may be empty
// or 0.0.0.0 for every interface, PORT 0 for a free one), or "".
func checkMetricsAddr(addr string) error {
	if addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("--metrics-addr=%s: want HOST:PORT, e.g. 0.0.0.0:9400: %v", addr, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return usagef("--metrics-addr=%s: port %q is not 0-65535", addr, port)
	}
	return nil
}

// splitHostPort splits HOST[:PORT]; port is -1 when absent, and 0
// (torchrun's "a free port") is allowed: callers say where it means
// something.
func splitHostPort(endpoint string) (string, int, error) {
	host, portStr, hasPort := strings.Cut(endpoint, ":")
	if strings.HasPrefix(endpoint, "[") { // [v6]:port
		end := strings.Index(endpoint, "]")
		if end < 0 {
			return "", 0, fmt.Errorf("endpoint %q: missing ]", endpoint)
		}
		host = endpoint[1:end]
		portStr, hasPort = strings.CutPrefix(endpoint[end+1:], ":")
	}
	if !hasPort {
		return host, -1, nil
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("endpoint %q: port %q is not 1-65535 (or 0 for a free port on one node)", endpoint, portStr)
	}
	return host, port, nil
}
