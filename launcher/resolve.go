package launcher

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/internal/build"
	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/internal/proc"
	"github.com/gorun/gorun/internal/workerlog"
	"github.com/gorun/gorun/slurm"
	"github.com/gorun/gorun/trainer/config"
)

// Host is what Resolve may learn about the machine it runs on. Production
// code uses LocalHost; tests fill it in.
type Host struct {
	Lookup   func(string) (string, bool)       // environment
	Environ  []string                          // the environment workers inherit
	Hostname string                            // os.Hostname
	NumCPU   int                               // CPUs this process may run on
	Glob     func(string) ([]string, error)    // /dev/nvidia* lookup
	LookPath func(string) (string, error)      // program lookup on PATH
	Stat     func(string) (os.FileInfo, error) // script lookup
	FreePort func(host string) (int, error)    // a port free on host now
	TempDir  func() (string, error)            // where error files go without --log-dir
	// Executable is this gorun binary, which runs train.toml workers
	// (`gorun worker`) when no WorkerBinary lies beside it.
	Executable func() (string, error)
	// BuildOf names the build of the Go binary at a path (build.OfFile):
	// gorun runs the WorkerBinary beside it only when both name the same
	// build or either names none.
	BuildOf func(path string) (string, error)
	// ReadFile reads a train.toml entrypoint, to check it once here and
	// take its [elastic] settings.
	ReadFile func(string) ([]byte, error)
	// NewRunID returns a run id no other launch has: the run id of a
	// one-node launch outside SLURM without --rdzv-id.
	NewRunID func() (string, error)
	// LookupIP resolves a host name (net.LookupIP) and IfaceAddrs
	// lists this machine's addresses (net.InterfaceAddrs): they tell
	// which node hosts a c10d --rdzv-endpoint.
	LookupIP   func(string) ([]net.IP, error)
	IfaceAddrs func() ([]net.Addr, error)
	// Machine is where the hardware is read: /dev/nvidia* files, and for
	// --numa-binding the GPUs' and CPUs' places in sysfs.
	Machine Machine
	// TaskCPUs returns the CPUs this process may run on
	// (sched_getaffinity: SLURM's cpuset), within which --numa-binding
	// places workers.
	TaskCPUs func() ([]int, error)
}

// LocalHost is the Host of this process.
func LocalHost() Host {
	name, _ := os.Hostname()
	return Host{
		Lookup:     os.LookupEnv,
		Environ:    os.Environ(),
		Hostname:   name,
		NumCPU:     runtime.NumCPU(), // Go counts the CPUs of its affinity mask, which SLURM sets
		Glob:       filepath.Glob,
		LookPath:   exec.LookPath,
		Stat:       os.Stat,
		FreePort:   freePort,
		TempDir:    func() (string, error) { return os.MkdirTemp("", "gorun-") },
		Executable: os.Executable,
		BuildOf:    build.OfFile,
		ReadFile:   os.ReadFile,
		NewRunID:   randomRunID,
		LookupIP:   net.LookupIP,
		IfaceAddrs: net.InterfaceAddrs,
		Machine:    LocalMachine(),
		TaskCPUs:   func() ([]int, error) { return proc.CPUsOf(0) },
	}
}

// randomRunID is a fresh run id: "gorun-" and 48 random bits in hex.
func randomRunID() (string, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("random run id: %w", err)
	}
	return "gorun-" + hex.EncodeToString(b[:]), nil
}

// Launch is everything this node will do, resolved: `gorun plan` prints it
// as JSON and the agent runs it.
type Launch struct {
	RunID        string     `json:"run_id"`
	Host         string     `json:"host"`
	Addr         string     `json:"addr"`      // where other nodes and workers reach this node (--local-addr)
	NodeRank     int        `json:"node_rank"` // static: this node's rank; etcd: the preferred rank, -1 for join order
	MinNodes     int        `json:"min_nodes"`
	MaxNodes     int        `json:"max_nodes"`
	NProcPerNode int        `json:"nproc_per_node"`
	NProcSource  string     `json:"nproc_source"`
	MasterAddr   string     `json:"master_addr"`
	MasterPort   int        `json:"master_port"`
	Rendezvous   Rendezvous `json:"rendezvous"`
	Role         string     `json:"role"`
	MaxRestarts  int        `json:"max_restarts"`
	TermTimeout  Duration   `json:"term_timeout"`
	Heartbeat    Duration   `json:"heartbeat_timeout,omitempty"`
	// EvictStragglers: a node whose rank stays the job's straggler this
	// long evicts itself (the job goes on without it); 0: never.
	EvictStragglers Duration `json:"evict_stragglers,omitempty"`
	MetricsAddr     string   `json:"metrics_addr,omitempty"` // Prometheus /metrics of this agent
	// Snapshots gives the workers a per-job directory on a tmpfs for their
	// training-state snapshots (GORUN_SNAPSHOT_DIR), the gorun Python
	// package on PYTHONPATH, and, for scripts, the step the agents agreed
	// they restore (docs/snapshots.md); SnapshotReplicas is how many other
	// nodes keep a copy of each rank's snapshots.
	Snapshots        bool `json:"snapshots"`
	SnapshotReplicas int  `json:"snapshot_replicas"`
	// WarmWorkers: Python workers start warm (--warm-workers,
	// elastic.Spec.Warm): only with snapshots (the gorun package holds the
	// warm worker's code) and a command that warmCommand knows.
	WarmWorkers bool `json:"warm_workers,omitempty"`
	// SnapshotDurable, when not nil, also copies the snapshots to a
	// directory that outlives the nodes (shared storage).
	SnapshotDurable *DurableSnapshots `json:"snapshot_durable,omitempty"`
	Command         []string          `json:"command"`
	LogDir          string            `json:"log_dir,omitempty"`
	Redirects       workerlog.StdSpec `json:"-"`
	Tee             workerlog.StdSpec `json:"-"`
	ShowRanks       []int             `json:"local_ranks_filter,omitempty"`
	GPUs            []string          `json:"gpus,omitempty"`
	GPUSource       string            `json:"gpu_source,omitempty"`
	// VirtualLocalRank (torchrun's --virtual-local-rank): every worker
	// gets LOCAL_RANK=0 and WorkerGPUs[local rank] as its only GPU.
	VirtualLocalRank bool       `json:"virtual_local_rank,omitempty"`
	WorkerGPUs       [][]string `json:"-"` // in Workers' visible_gpus
	// NumaBinding is torchrun's --numa-binding mode; WorkerCPUs the CPU
	// affinity of each local worker it gives.
	NumaBinding string  `json:"numa_binding,omitempty"`
	WorkerCPUs  [][]int `json:"worker_cpus,omitempty"`
	// PrefixTemplate is TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE when set:
	// the console prefix of worker lines ("" none); nil: "[host:rank] ".
	PrefixTemplate *string    `json:"log_line_prefix_template,omitempty"`
	SLURM          *slurm.Job `json:"slurm,omitempty"`
	// Workers are this node's workers for the first attempt; later
	// attempts differ only in restart count and error file.
	Workers []distenv.Worker `json:"workers"`
	// Environ is the environment every worker inherits before the
	// contract's variables are set over it.
	Environ []string `json:"-"`
	// WorkerEnv is, per local worker, the full environment it gets; filled
	// for `gorun plan` only.
	WorkerEnv [][]string `json:"worker_env,omitempty"`
	// Secret is the job secret, given to every worker in GORUN_JOB_SECRET
	// (in Environ); zero: none, the job runs unauthenticated.
	Secret jobsecret.Secret `json:"-"`
	// SecretSource says where Secret came from, or "none".
	SecretSource string `json:"job_secret"`
	// StartNodes, when above MinNodes, is how many nodes the first round
	// waits for (see SLURMNodes); 0: MinNodes.
	StartNodes int `json:"start_nodes,omitempty"`
	// InPlace keeps the workers across a membership change (a node lost
	// or joining) instead of restarting them: train.toml entrypoints (the
	// embedded trainer speaks the heartbeat channel), never scripts.
	InPlace bool `json:"in_place"`
	// gpuDevices are the machine devices of the GPUs (see gpuSet.Devices).
	gpuDevices []string
	// Notes say what gorun does differently from torchrun for this
	// command line (a flag accepted but ignored, a default that may
	// surprise): `gorun plan` prints them and the launch logs each as a
	// warning.
	Notes []string `json:"notes,omitempty"`
}

// Duration prints as "30s" in JSON.
type Duration time.Duration

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// WorldSize is the number of workers in the job's first round.
func (l *Launch) WorldSize() int { return l.firstNodes() * l.NProcPerNode }

// firstNodes is how many nodes the job's first round needs.
func (l *Launch) firstNodes() int { return max(l.MinNodes, l.StartNodes) }

// Resolve turns opts into a Launch on host. Every error in what the user
// asked for is a *UsageError that says what to change.
func Resolve(opts Options, host Host) (*Launch, error) {
	job, underSLURM, err := slurm.FromEnv(host.Lookup)
	if err != nil {
		return nil, usagef("%v", err)
	}
	l := &Launch{
		Role:             orDefault(opts.Role, "default"),
		MaxRestarts:      opts.MaxRestarts,
		TermTimeout:      Duration(opts.TermTimeout),
		Heartbeat:        Duration(opts.HeartbeatTimeout),
		EvictStragglers:  Duration(opts.EvictStragglers),
		MetricsAddr:      opts.MetricsAddr,
		Snapshots:        !opts.NoSnapshots,
		SnapshotReplicas: opts.SnapshotReplicas,
		LogDir:           opts.LogDir,
		Environ:          host.Environ,
	}
	if opts.MaxRestarts < 0 {
		return nil, usagef("--max-restarts=%d: want 0 or more", opts.MaxRestarts)
	}
	if opts.HeartbeatTimeout < 0 {
		return nil, usagef("--heartbeat-timeout=%s: want a duration of 0 (off) or more", opts.HeartbeatTimeout)
	}
	if opts.EvictStragglers < 0 {
		return nil, usagef("--evict-stragglers=%s: want a duration of 0 (off) or more", opts.EvictStragglers)
	}
	if opts.SnapshotReplicas < 0 {
		return nil, usagef("--snapshot-replicas=%d: want 0 (no copies on other nodes) or more", opts.SnapshotReplicas)
	}
	if l.SnapshotDurable, err = resolveDurable(opts); err != nil {
		return nil, err
	}
	if err := checkMetricsAddr(opts.MetricsAddr); err != nil {
		return nil, err
	}
	if opts.TermTimeout < 0 {
		return nil, usagef("--term-timeout=%s: want a duration of 0 or more", opts.TermTimeout)
	}
	if err := l.checkCompat(opts); err != nil {
		return nil, err
	}
	if underSLURM {
		l.SLURM = &job
		if err := checkSLURMStep(job); err != nil {
			return nil, err
		}
	}
	l.Host = firstNonEmpty(opts.NodeName, job.Hostname, host.Hostname, "localhost")
	l.Addr = firstNonEmpty(opts.LocalAddr, l.Host)
	if err := l.resolveNodes(opts, job, underSLURM); err != nil {
		return nil, err
	}
	if l.Rendezvous.Backend == BackendStatic {
		if err := l.resolveMaster(opts, job, underSLURM, host); err != nil {
			return nil, err
		}
	} else if err := l.resolveEtcd(opts, job, underSLURM, host); err != nil {
		return nil, err
	}
	if err := l.resolveRunID(opts, job, underSLURM, host); err != nil {
		return nil, err
	}
	if err := l.resolveSecret(opts, host); err != nil {
		return nil, err
	}
	if err := l.resolveNProc(opts, host); err != nil {
		return nil, err
	}
	if err := l.resolvePlacement(opts, host); err != nil {
		return nil, err
	}
	if t, set := host.Lookup(workerlog.PrefixTemplateEnv); set {
		l.PrefixTemplate = &t
	}
	var note string
	if l.Command, note, err = command(opts, host); err != nil {
		return nil, err
	}
	if note != "" {
		l.note(note)
	}
	if opts.WarmWorkers {
		switch {
		case !l.Snapshots:
			l.note("--warm-workers needs --snapshots (the gorun package they put on PYTHONPATH runs the warm workers): every worker starts cold")
		case warmCommand(l.Command, "_warm.py") == nil:
			l.note(fmt.Sprintf("--warm-workers: %q is not a Python interpreter running a script or -m module with options a warm worker keeps (not -c, -E, -I, -P): every worker starts cold", strings.Join(l.Command, " ")))
		default:
			l.WarmWorkers = true
		}
	}
	if err := l.readTrainConfig(opts, host); err != nil {
		return nil, err
	}
	if err := l.resolveLogs(opts); err != nil {
		return nil, err
	}
	errorDir := planErrorDir
	if l.LogDir != "" {
		errorDir = filepath.Join(l.LogDir, l.RunID)
	}
	spec := l.AgentSpec(Runtime{}, errorDir)
	round := l.staticRound()
	for i := 0; i < l.NProcPerNode; i++ {
		w := spec.Contract(round, i)
		if l.Rendezvous.Backend == BackendStatic {
			if err := w.Validate(); err != nil {
				return nil, usagef("%v", err)
			}
		}
		l.Workers = append(l.Workers, w)
	}
	return l, nil
}

// checkSLURMStep refuses SLURM set-ups where gorun would not be the one
// agent of its node.
func checkSLURMStep(job slurm.Job) error {
	// Only a step (srun) starts tasks; the batch script runs once, whatever
	// --ntasks the job asked for.
	if n := job.TasksOnThisNode(); job.StepID != "" && n > 1 {
		return usagef("SLURM started %d gorun tasks on node %s: gorun starts the workers itself, so run one task per node: srun --ntasks-per-node=1 gorun ...", n, orDefault(job.Hostname, strconv.Itoa(job.NodeID)))
	}
	if job.StepID == "" && job.NumNodes > 1 {
		return usagef("this is the batch script of a %d-node SLURM job: start gorun once per node with srun --ntasks-per-node=1 gorun ...", job.NumNodes)
	}
	return nil
}

func (l *Launch) resolveNodes(opts Options, job slurm.Job, underSLURM bool) error {
	conf, err := ParseRdzvConf(opts.RdzvConf)
	if err != nil {
		return err
	}
	l.Rendezvous = Rendezvous{Endpoint: opts.RdzvEndpoint, Conf: conf}
	l.MinNodes, l.MaxNodes, l.NodeRank = 1, 1, 0
	if underSLURM {
		l.MinNodes, l.MaxNodes, l.NodeRank = job.NumNodes, job.NumNodes, job.NodeID
	}
	if opts.NNodes != "" {
		if l.MinNodes, l.MaxNodes, err = ParseNNodes(opts.NNodes); err != nil {
			return err
		}
	}
	if opts.Standalone {
		if l.MaxNodes != 1 {
			return usagef("--standalone runs one node, but this launch has %s (%s): give --nnodes=1 to run one node on its own", nodesDesc(l.MinNodes, l.MaxNodes), orDefault(flagOrEmpty("--nnodes=", opts.NNodes), "the SLURM step's nodes"))
		}
		l.NodeRank = 0
	}
	rankKnown := underSLURM || opts.NodeRank >= 0
	if opts.NodeRank >= 0 {
		l.NodeRank = opts.NodeRank
	}
	if l.NodeRank >= l.MaxNodes {
		return usagef("node rank %d is outside --nnodes=%s (ranks 0..%d)", l.NodeRank, orDefault(opts.NNodes, strconv.Itoa(l.MaxNodes)), l.MaxNodes-1)
	}
	l.Rendezvous.Backend, err = l.chooseBackend(opts, underSLURM, rankKnown)
	if err != nil {
		return err
	}
	if l.Rendezvous.Backend == BackendEtcd && !rankKnown {
		l.NodeRank = -1 // ranked in join order
	}
	if underSLURM && opts.NNodes == "" && l.Rendezvous.Backend == BackendEtcd {
		l.MinNodes, l.StartNodes = SLURMNodes(job.NumNodes)
	}
	return nil
}

// SLURMNodes is the rule for a SLURM step of n nodes launched without
// --nnodes over etcd (gorun's default there): the first round waits for
// all n nodes (start), as a static job would, and after a node is lost the
// job goes on with the nodes left, down to one (min), whether its workers
// recover in place or restart. SLURM never sends a replacement node to a
// running step, so waiting for one would wait until join_timeout and fail;
// a node that does join later (a new srun of the same job) is taken in as
// a spare, up to n. --nnodes=MIN:MAX sets both bounds instead.
func SLURMNodes(n int) (min, start int) { return 1, n }

// resolveRunID picks the run id: --rdzv-id, else SLURM_JOB_ID, else a
// fresh one for a launch of one node. A launch that meets other nodes over
// an etcd of the user's needs the same run id on every node, which only
// the user can give; a static one shares nothing, and a c10d one meets
// over an etcd made for this launch: both take torchrun's "none".
func (l *Launch) resolveRunID(opts Options, job slurm.Job, underSLURM bool, host Host) error {
	switch {
	case opts.RdzvID != "":
		l.RunID = opts.RdzvID
	case underSLURM && job.JobID != "":
		l.RunID = job.JobID
	case l.MaxNodes == 1:
		id, err := host.NewRunID()
		if err != nil {
			return err
		}
		l.RunID = id
	case l.c10dAtEndpoint(opts):
		// torchrun's default: the endpoint's embedded etcd is fresh for
		// every launch, so nothing of another run is met there.
		l.RunID = "none"
	case l.Rendezvous.Backend == BackendEtcd:
		return usagef("--nnodes=%s over etcd outside SLURM: give every node the same --rdzv-id (a name for this run, e.g. --rdzv-id=myjob-1), so that they meet in one run", orDefault(opts.NNodes, strconv.Itoa(l.MaxNodes)))
	default:
		l.RunID = "none"
	}
	if strings.ContainsAny(l.RunID, "/\x00") || l.RunID == "." || l.RunID == ".." {
		return usagef("--rdzv-id=%q: the run id names a directory; use letters, digits, '-', '_' or '.'", l.RunID)
	}
	l.Rendezvous.ID = l.RunID
	return nil
}

// torchrunMasterPort is torchrun's --master-port: what a static launch of
// several nodes outside SLURM uses when none is given.
const torchrunMasterPort = 29500

// resolveMaster picks MASTER_ADDR and MASTER_PORT: flags, then the
// rendezvous endpoint, then SLURM's first node and a port derived from the
// job id, then, outside SLURM, 127.0.0.1 and a free port for one node or
// torchrun's 29500 for several. An endpoint HOST:0 (torchrun's stacked
// single-node recipe) asks for a free port.
func (l *Launch) resolveMaster(opts Options, job slurm.Job, underSLURM bool, host Host) error {
	addr, port := opts.MasterAddr, opts.MasterPort
	freeAsked := false
	if opts.RdzvEndpoint != "" && !opts.Standalone {
		h, p, err := splitHostPort(opts.RdzvEndpoint)
		if err != nil {
			return usagef("--rdzv-endpoint: %v", err)
		}
		if p == 0 && l.MinNodes > 1 && port == 0 {
			return usagef("--rdzv-endpoint=%s: port 0 (a free port) works for one node only: with --nnodes=%d every node must be given the same port", opts.RdzvEndpoint, l.MinNodes)
		}
		freeAsked = p == 0 && port == 0
		if masterGiven(opts) && (addr != "" && addr != h || port != 0 && p > 0 && port != p) {
			// torchrun's static rendezvous takes its master from the
			// endpoint when there is one (run.py, get_rdzv_endpoint).
			l.note(fmt.Sprintf("--master-addr/--master-port ignored: the master of the static rendezvous is --rdzv-endpoint=%s, as in torchrun", opts.RdzvEndpoint))
			addr, port = "", 0
		}
		addr = firstNonEmpty(h, addr)
		if p > 0 {
			port = p
		}
	}
	if underSLURM && !opts.Standalone {
		if len(job.Nodes) > 0 {
			addr = firstNonEmpty(addr, job.Nodes[0])
		}
		if !freeAsked {
			port = firstNonZero(port, slurm.JobPorts(job.JobID).Master)
		}
	}
	if addr == "" {
		if l.MinNodes > 1 {
			return usagef("--nnodes=%d: give --master-addr (the host of node rank 0) or --rdzv-endpoint (torchrun would take 127.0.0.1, which only works when every node is this machine: then say --master-addr=127.0.0.1)", l.MinNodes)
		}
		addr = "127.0.0.1"
	}
	if port == 0 && l.MinNodes > 1 {
		port = torchrunMasterPort
	}
	if port == 0 {
		p, err := host.FreePort(addr)
		if err != nil {
			return fmt.Errorf("pick a free master port on %s: %w", addr, err)
		}
		port = p
	}
	if port < 1 || port > 65535 {
		return usagef("--master-port=%d: want 1-65535", port)
	}
	l.MasterAddr, l.MasterPort = addr, port
	return nil
}

// embeddedTrainer reports whether the workers run gorun's own trainer (a train.toml entrypoint).
func embeddedTrainer(opts Options) bool {
	return !opts.NoPython && !opts.Module && !opts.RunPath && strings.HasSuffix(opts.Entrypoint, ".toml")
}

func (l *Launch) resolveNProc(opts Options, host Host) error {
	devRoot := orDefault(host.Machine.DevRoot, "/dev")
	gpus := findGPUs(host.Lookup, devRoot, host.Glob)
	l.GPUs, l.GPUSource, l.gpuDevices = gpus.IDs, gpus.Source, gpus.Devices
	if gpus.Inherited {
		l.GPUSource += " (CUDA_VISIBLE_DEVICES inherited)"
	}
	// An inherited CUDA_VISIBLE_DEVICES on a machine with no GPU names
	// GPUs CUDA will not find: torchrun's torch.cuda.is_available() is
	// false there, so gpu fails and auto counts CPUs. SLURM's lists come
	// from the GPUs it manages.
	var noGPU string
	if gpus.Inherited && len(gpus.IDs) > 0 && !hasGPUDevice(devRoot, host.Glob) {
		noGPU = fmt.Sprintf("CUDA_VISIBLE_DEVICES=%s lists GPUs, but this machine has none (no %s/nvidia*, nvidiactl or kfd)",
			strings.Join(gpus.IDs, ","), devRoot)
	}
	spec := strings.ToLower(orDefault(opts.NProcPerNode, "1"))
	switch spec {
	case "auto":
		if noGPU != "" {
			l.note(fmt.Sprintf("--nproc-per-node=auto: %s; it counts CPUs, as torchrun's does when CUDA is not available", noGPU))
		}
		if len(gpus.IDs) > 0 && noGPU == "" {
			l.NProcPerNode, l.NProcSource = len(gpus.IDs), "auto: GPUs from "+gpus.Source
		} else if embeddedTrainer(opts) {
			// One worker with every CPU as its kernel threads (trainer.DefaultThreads): on the
			// bench model it ran ahead of one worker per CPU (bench/threads.sh, docs/benchmarks.md).
			l.NProcPerNode, l.NProcSource = 1, "auto: no GPUs, one embedded-trainer worker using every CPU"
		} else {
			l.NProcPerNode, l.NProcSource = host.NumCPU, "auto: no GPUs, one worker per CPU"
		}
	case "gpu":
		if len(gpus.IDs) == 0 {
			return usagef("--nproc-per-node=gpu: no GPUs found (CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS, SLURM_GPUS_ON_NODE, /dev/nvidia*); give a number")
		}
		if noGPU != "" {
			return usagef("--nproc-per-node=gpu: %s; torchrun refuses it too (\"Cuda is not available\"): run on a GPU node, or give a number of workers", noGPU)
		}
		l.NProcPerNode, l.NProcSource = len(gpus.IDs), "GPUs from "+gpus.Source
	case "cpu":
		l.NProcPerNode, l.NProcSource = host.NumCPU, "one worker per CPU"
	default:
		n, err := strconv.Atoi(spec)
		if err != nil || n < 1 {
			return usagef("--nproc-per-node=%s: want a number of workers >= 1, or auto, gpu or cpu", opts.NProcPerNode)
		}
		l.NProcPerNode, l.NProcSource = n, "flag"
	}
	if l.NProcPerNode < 1 {
		l.NProcPerNode = 1
	}
	return nil
}

// WorkerBinary is the name of the lean trainer worker (cmd/gorun-worker):
// for a train.toml, gorun runs the one in its own binary's directory.
const WorkerBinary = "gorun-worker"

// tomlWorker is the start of a train.toml worker's argv, the train.toml
// and its arguments to follow: the WorkerBinary beside this gorun binary
// when there is one built from the same tree, else this binary's `worker`
// command, which is the same program with the rest of gorun linked in
// (about 20 MB more resident memory a worker, see cmd/gorun-worker). Its
// note says why it is not the WorkerBinary; "" when it is.
func tomlWorker(host Host) (argv []string, note string, err error) {
	self, err := host.Executable()
	if err != nil {
		return nil, "", fmt.Errorf("find the gorun binary to run train.toml workers: %w", err)
	}
	fallback := func(why string) ([]string, string, error) {
		return []string{self, "worker"}, fmt.Sprintf("train.toml workers run `%s worker`, not %s: %s; "+
			"%s saves about 20 MB of resident memory a worker (go build -o DIR/ ./cmd/gorun ./cmd/%s)",
			self, WorkerBinary, why, WorkerBinary, WorkerBinary), nil
	}
	lean := filepath.Join(filepath.Dir(self), WorkerBinary)
	info, err := host.Stat(lean)
	switch {
	case err != nil:
		return fallback(fmt.Sprintf("there is none in %s", filepath.Dir(self)))
	case !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0:
		return fallback(lean + " is not an executable file")
	}
	leanBuild, err := host.BuildOf(lean)
	if err != nil {
		return fallback(fmt.Sprintf("%s is not a Go binary gorun can read (%v)", lean, unwrapPathError(err)))
	}
	selfBuild, err := host.BuildOf(self)
	if err != nil {
		return fallback(fmt.Sprintf("gorun cannot read its own build (%v)", unwrapPathError(err)))
	}
	if leanBuild != "" && selfBuild != "" && leanBuild != selfBuild {
		return fallback(fmt.Sprintf("%s is build %q, gorun is build %q", lean, leanBuild, selfBuild))
	}
	return []string{lean}, "", nil
}

// command builds the worker argv: a .toml entrypoint is the embedded
// trainer (tomlWorker: gorun-worker, or this binary's `worker` command,
// with a note saying why), a .py entrypoint runs with
// the Python interpreter (pythonInterpreter: $PYTHON_EXEC, $PYTHON, python3) -u, anything else, or
// anything under --no-python, runs as a program. As in torchrun,
// --run-path runs the script through runpy.run_path whatever its name,
// and -m runs python -u -m MODULE.
func command(opts Options, host Host) (argv []string, note string, err error) {
	if opts.Entrypoint == "" {
		return nil, "", usagef("no entrypoint: gorun [flags] train.toml|script.py [args], gorun [flags] -m module [args], or gorun [flags] -- program [args]")
	}
	switch {
	case opts.RunPath:
		if _, err := host.Stat(opts.Entrypoint); err != nil {
			return nil, "", usagef("--run-path script %s: %v", opts.Entrypoint, unwrapPathError(err))
		}
		python, err := pythonInterpreter(host)
		if err != nil {
			return nil, "", err
		}
		return append([]string{python, "-u", "-c", runPathCode, opts.Entrypoint}, opts.Args...), "", nil
	case opts.Module && opts.NoPython:
		return nil, "", usagef("-m/--module runs a Python module and --no-python runs a program: give one of them, not both")
	case opts.Module:
		python, err := pythonInterpreter(host)
		if err != nil {
			return nil, "", err
		}
		return append([]string{python, "-u", "-m", opts.Entrypoint}, opts.Args...), "", nil
	}
	if !opts.NoPython && strings.HasSuffix(opts.Entrypoint, ".toml") {
		if _, err := host.Stat(opts.Entrypoint); err != nil {
			return nil, "", usagef("config %s: %v", opts.Entrypoint, unwrapPathError(err))
		}
		worker, note, err := tomlWorker(host)
		if err != nil {
			return nil, "", err
		}
		return append(append(worker, opts.Entrypoint), opts.Args...), note, nil
	}
	if !opts.NoPython && strings.HasSuffix(opts.Entrypoint, ".py") {
		if _, err := host.Stat(opts.Entrypoint); err != nil {
			return nil, "", usagef("script %s: %v", opts.Entrypoint, unwrapPathError(err))
		}
		python, err := pythonInterpreter(host)
		if err != nil {
			return nil, "", err
		}
		return append([]string{python, "-u", opts.Entrypoint}, opts.Args...), "", nil
	}
	prog, err := host.LookPath(opts.Entrypoint)
	if err != nil {
		return nil, "", usagef("program %s: not found or not executable", opts.Entrypoint)
	}
	return append([]string{prog}, opts.Args...), "", nil
}

// runPathCode is what --run-path runs with python -c SCRIPT ARGS...: the
// script as __main__ through runpy.run_path, with sys.argv as the script
// would see it under python SCRIPT ARGS..., which is what torchrun's
// --run-path does in its worker process.
const runPathCode = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"

// pythonInterpreter finds the interpreter of Python workers: $PYTHON,
// else python3, on PATH.
func pythonInterpreter(host Host) (string, error) {
	// torchrun's PYTHON_EXEC first, then gorun's PYTHON.
	pyVar, pyName := "PYTHON_EXEC", ""
	for _, v := range []string{"PYTHON_EXEC", "PYTHON"} {
		if s, _ := host.Lookup(v); s != "" {
			pyVar, pyName = v, s
			break
		}
	}
	pyName = orDefault(pyName, "python3")
	python, err := host.LookPath(pyName)
	if err != nil {
		return "", usagef("python interpreter %q not found (set %s to the interpreter that has torch): %v", pyName, pyVar, errors.Unwrap(err))
	}
	return python, nil
}

func (l *Launch) resolveLogs(opts Options) error {
	var err error
	if l.Redirects, err = workerlog.ParseStd(orDefault(opts.Redirects, "0")); err != nil {
		return usagef("--redirects: %v", err)
	}
	if l.Tee, err = workerlog.ParseStd(orDefault(opts.Tee, "0")); err != nil {
		return usagef("--tee: %v", err)
	}
	if l.ShowRanks, err = workerlog.ParseLocalRanks(opts.LocalRanksFilter); err != nil {
		return usagef("--local-ranks-filter: %v", err)
	}
	return nil
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func freePort(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// nodesDesc says "4 nodes" or "2 to 4 nodes".
func nodesDesc(min, max int) string {
	if min == max {
		return fmt.Sprintf("%d nodes", min)
	}
	return fmt.Sprintf("%d to %d nodes", min, max)
}

// flagOrEmpty is flag+value, or "" when value is.
func flagOrEmpty(flag, value string) string {
	if value == "" {
		return ""
	}
	return flag + value
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

func firstNonZero(ns ...int) int {
	for _, n := range ns {
		if n != 0 {
			return n
		}
	}
	return 0
}

// Std is d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// readTrainConfig checks a train.toml entrypoint once, here, rather than
// in every worker (a bad key is one error with file:line before anything
// starts), and takes gorun's own settings from its [elastic] section
// unless a flag set them.
func (l *Launch) readTrainConfig(opts Options, host Host) error {
	if !embeddedTrainer(opts) {
		return nil
	}
	data, err := host.ReadFile(opts.Entrypoint)
	if err != nil {
		return usagef("config %s: %v", opts.Entrypoint, unwrapPathError(err))
	}
	// The worker's other flags are its own: with a nil valued, a value
	// written apart from its flag counts as a positional argument, unread.
	_, sets, _, err := config.SplitArgs(opts.Args, nil)
	if err != nil {
		return usagef("%s: %v", opts.Entrypoint, err)
	}
	cfg, err := config.Parse(opts.Entrypoint, data, sets)
	if err != nil {
		return usagef("%v", err)
	}
	if opts.HeartbeatTimeout == 0 {
		l.Heartbeat = Duration(cfg.Elastic.Heartbeat())
	}
	if l.SnapshotDurable != nil {
		return usagef("--snapshot-durable: the embedded trainer (%s) keeps its workers and their snapshots in place and copies none; drop the flag", opts.Entrypoint)
	}
	l.InPlace = true
	return nil
}

// DurableSnapshots is where and how often the workers' snapshots are
// also copied to shared storage (internal/snapshot/durable).
type DurableSnapshots struct {
	Dir   string `json:"dir"`   // absolute; made at start when missing
	Every int    `json:"every"` // every Every-th step
	Keep  int    `json:"keep"`  // the newest Keep complete steps
}

// resolveDurable is the --snapshot-durable* flags checked: nil without
// a directory; a usage error for a count below 1 or a directory with
// --snapshots=false.
func resolveDurable(opts Options) (*DurableSnapshots, error) {
	if opts.SnapshotDurable == "" {
		return nil, nil
	}
	if opts.NoSnapshots {
		return nil, usagef("--snapshot-durable=%s copies the snapshots that --snapshots=false turns off: drop one of them", opts.SnapshotDurable)
	}
	if opts.SnapshotDurableEvery < 1 {
		return nil, usagef("--snapshot-durable-every=%d: want 1 (every step's snapshot) or more", opts.SnapshotDurableEvery)
	}
	if opts.SnapshotDurableKeep < 1 {
		return nil, usagef("--snapshot-durable-keep=%d: want 1 or more complete steps kept", opts.SnapshotDurableKeep)
	}
	dir, err := filepath.Abs(opts.SnapshotDurable)
	if err != nil {
		return nil, usagef("--snapshot-durable=%s: %v", opts.SnapshotDurable, err)
	}
	return &DurableSnapshots{Dir: dir, Every: opts.SnapshotDurableEvery, Keep: opts.SnapshotDurableKeep}, nil
}
