package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/internal/proc"
	"github.com/gorun/gorun/internal/snapshot"
	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous/etcdembed"
	"github.com/gorun/gorun/slurm"
)

// exitUsage is the exit status for bad input, as in most Unix tools.
const exitUsage = 2

// guardCommand is the hidden command gorun re-executes itself with to
// start its guard process (proc.StartGuard).
const guardCommand = "guard"

// Flag categories, in help order.
const (
	catWorkers = "Workers"
	catNodes   = "Nodes and rendezvous"
	catOutput  = "Output"
)

// flagSpec is one launch flag: its name, torchrun's underscore alias and
// the environment variables it is read from.
func envVars(name string) []string {
	up := strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	return []string{"GORUN_" + up, "PET_" + up}
}

func aliases(name string) []string {
	if alt := strings.ReplaceAll(name, "-", "_"); alt != name {
		return []string{alt}
	}
	return nil
}

func stringFlag(cat, name, value, usage string) *cli.StringFlag {
	return &cli.StringFlag{Name: name, Aliases: aliases(name), EnvVars: envVars(name), Value: value, Usage: usage, Category: cat}
}

func intFlag(cat, name string, value int, usage string) *cli.IntFlag {
	return &cli.IntFlag{Name: name, Aliases: aliases(name), EnvVars: envVars(name), Value: value, Usage: usage, Category: cat}
}

func boolFlag(cat, name, usage string) *cli.BoolFlag {
	return &cli.BoolFlag{Name: name, Aliases: aliases(name), EnvVars: envVars(name), Usage: usage, Category: cat}
}

// secondsValue is a time flag's value: seconds as torchrun writes them
// ("5", "0.1"), or a Go duration ("100ms"): launcher.ParseSeconds.
type secondsValue struct{ d time.Duration }

// Set implements flag.Value.
func (v *secondsValue) Set(s string) error {
	d, err := launcher.ParseSeconds(s)
	if err != nil {
		return err
	}
	v.d = d
	return nil
}

// String implements flag.Value.
func (v *secondsValue) String() string { return v.d.String() }

// secondsFlag is a time flag that takes seconds or a duration; extra
// names and variables (torchrun's other spelling of the same setting)
// follow the usual ones.
func secondsFlag(cat, name string, value time.Duration, usage string, extraNames, extraEnv []string) *cli.GenericFlag {
	return &cli.GenericFlag{
		Name: name, Aliases: append(aliases(name), extraNames...), EnvVars: append(envVars(name), extraEnv...),
		Value: &secondsValue{d: value}, Usage: usage, Category: cat,
	}
}

// seconds reads the value of a secondsFlag.
func seconds(c *cli.Context, name string) time.Duration {
	if v, ok := c.Generic(name).(*secondsValue); ok {
		return v.d
	}
	return 0
}

// shortString and shortBool add a one-letter spelling (torchrun's -m,
// -r, -t) to f.
func shortString(f *cli.StringFlag, short string) *cli.StringFlag {
	f.Aliases = append([]string{short}, f.Aliases...)
	return f
}

// defaultTrue makes f true unless given false (--name=false).
func defaultTrue(f *cli.BoolFlag) *cli.BoolFlag {
	f.Value = true
	return f
}

func shortBool(f *cli.BoolFlag, short string) *cli.BoolFlag {
	f.Aliases = append([]string{short}, f.Aliases...)
	return f
}

// launchFlags are the flags of `gorun` and `gorun plan`.
func launchFlags() []cli.Flag {
	return []cli.Flag{
		stringFlag(catWorkers, "nproc-per-node", "1", "workers on this node: N, or auto (GPUs, else CPUs), gpu, cpu"),
		boolFlag(catWorkers, "no-python", "run ENTRYPOINT as a program, not as a Python script"),
		shortBool(boolFlag(catWorkers, "module", "ENTRYPOINT is a Python module: each worker runs python -u -m MODULE args (torchrun's -m)"), "m"),
		boolFlag(catWorkers, "run-path", "run the script with runpy.run_path (python -u -c ...), whatever its name; wins over --no-python and -m"),
		stringFlag(catWorkers, "role", "default", "ROLE_NAME of the workers"),
		intFlag(catWorkers, "max-restarts", 0, "restarts after worker failures before the job fails, counted across all nodes (node losses have their own budget: --rdzv-conf max_membership_changes)"),
		secondsFlag(catWorkers, "monitor-interval", 100*time.Millisecond, "seconds; accepted for torchrun compatibility: gorun sees a worker exit at once, without polling", nil, nil),
		secondsFlag(catWorkers, "term-timeout", 30*time.Second, "seconds (or a duration: 30s) between the stop signal and SIGKILL (torchrun's --shutdown-timeout); also how long a successful worker's background children may run on before they are killed",
			[]string{"shutdown-timeout", "shutdown_timeout"}, []string{"PET_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"}),
		secondsFlag(catNodes, "evict-stragglers", 0, "seconds (or a duration: 2m): a node whose rank stays the job's straggler (1.5x its peers' median step compute or more) this long leaves the job, which goes on without it (a waiting spare takes its place; etcd rendezvous); 0: off", nil, nil),
		secondsFlag(catWorkers, "heartbeat-timeout", 0, "seconds (or a duration): a worker that reported progress (the embedded trainer does, each step) and then none for this long is hung: stack dump (SIGQUIT), kill, restart; 0: off", nil, nil),
		stringFlag(catWorkers, "start-method", "spawn", "spawn, fork or forkserver: accepted for torchrun compatibility; every worker is a new process either way"),
		stringFlag(catWorkers, "signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT", "torchrun's list, checked; gorun always stops the job on SIGTERM, SIGINT, SIGHUP, SIGQUIT and passes SIGUSR1, SIGUSR2 on to the workers"),
		stringFlag(catWorkers, "numa-binding", "", "bind each worker to CPUs near its GPU, as torchrun: node, socket, exclusive or core-complex (CPU workers: exclusive, a disjoint share of this task's CPUs each)"),
		boolFlag(catWorkers, "virtual-local-rank", "as torchrun: LOCAL_RANK=0 for every worker, each seeing only its own GPU in CUDA_VISIBLE_DEVICES"),
		defaultTrue(boolFlag(catWorkers, "snapshots", "keep the workers' training-state snapshots (python/gorun's gorun.Snapshots) in a per-job directory in /dev/shm that outlives them, put the gorun Python package on their PYTHONPATH, and restart them at the step every rank holds; --snapshots=false: none of it")),
		boolFlag(catWorkers, "warm-workers", "keep one Python interpreter per local rank that imported torch (and waits, shown as gorun-warm) ahead of the next round, and make it that round's worker: a restart without the workers' import of torch; needs --snapshots (docs/warm-workers.md)"),
		intFlag(catWorkers, "snapshot-replicas", 1, "copies of each rank's snapshots kept on other nodes (the next ones in node-rank order), so that the ranks of a lost node restore from memory; 0: none"),
		stringFlag(catWorkers, "snapshot-durable", "", "DIR on storage every node shares: every --snapshot-durable-every-th snapshot of each rank is also copied there in the background, and the job restores from it when no node holds a step every rank has (more nodes lost than --snapshot-replicas covers, or a requeued job); made when missing"),
		intFlag(catWorkers, "snapshot-durable-every", 100, "with --snapshot-durable: copy every N-th step's snapshot (1 or more)"),
		intFlag(catWorkers, "snapshot-durable-keep", 2, "with --snapshot-durable: keep the newest M complete steps there (1 or more)"),

		stringFlag(catNodes, "nnodes", "", "number of nodes N, or MIN:MAX for an elastic job (default: SLURM's, or 1)"),
		intFlag(catNodes, "node-rank", -1, "this node's rank (default: SLURM_NODEID, or 0)"),
		stringFlag(catNodes, "master-addr", "", "host of worker rank 0, static rendezvous (default: first node of the SLURM step, or 127.0.0.1); under SLURM it makes a multi-node job static"),
		intFlag(catNodes, "master-port", 0, "port of worker rank 0's store, static rendezvous (default: derived from the SLURM job id; several nodes: 29500; one node: a free port)"),
		boolFlag(catNodes, "standalone", "one node on its own: a free local port (or --master-port), nothing to rendezvous with"),
		stringFlag(catNodes, "rdzv-backend", "", "etcd (elastic rounds; the default under SLURM with several nodes, over an embedded etcd), static, or c10d (with --rdzv-endpoint and several nodes: elastic rounds over an etcd that the endpoint's node embeds; else static)"),
		stringFlag(catNodes, "rdzv-endpoint", "", "etcd HOST:PORT[,HOST:PORT...]; c10d: the HOST:PORT that the node owning HOST serves the rendezvous at (peers at PORT+1); static: the master; one node: HOST:0 picks a free port"),
		stringFlag(catNodes, "rdzv-id", "", "run id, the same on every node; a finished or dead run id runs again as its next incarnation (default: SLURM_JOB_ID; on one node, a fresh one; c10d at an endpoint: torchrun's none)"),
		stringFlag(catNodes, "rdzv-conf", "", "rendezvous settings k=v,...: lease_ttl, last_call_timeout, join_timeout, max_membership_changes, cacert, cert, key, user, password, dial_timeout, connect_timeout; torchrun's c10d keys: is_host, keep_alive_interval, keep_alive_max_attempt, read_timeout, close_timeout, heartbeat_timeout, use_libuv, store_type; other keys are ignored with a warning, as torchrun ignores them (docs/torchrun.md)"),
		stringFlag(catNodes, "node-name", "", "host name this node announces (default: SLURMD_NODENAME or the host name)"),
		stringFlag(catNodes, "local-addr", "", "address other nodes and workers reach this node at (default: the node name)"),
		stringFlag(catNodes, "job-secret-file", "", "file (mode 600) holding the job secret, the same on every node: at least 32 hex digits, e.g. from gorun job-secret; else GORUN_JOB_SECRET, else one made for a one-node launch"),

		stringFlag(catOutput, "log-dir", "", "write each worker's output to DIR/RUN_ID/attempt_N/RANK/{stdout,stderr}.log"),
		shortString(stringFlag(catOutput, "redirects", "", "streams sent only to the log files: 0 none, 1 stdout, 2 stderr, 3 both, or per local rank 0:1,1:2"), "r"),
		shortString(stringFlag(catOutput, "tee", "", "streams sent to the log files as well as the console (the default with --log-dir)"), "t"),
		stringFlag(catOutput, "local-ranks-filter", "", "local ranks shown on the console, e.g. 0,2 (default: all)"),
		stringFlag(catOutput, "duplicate-stdout-filters", "", "torchrun's: copy console lines matching any of these (comma-separated, ,, for a comma) to a side file; accepted, not done yet (a warning says so)"),
		stringFlag(catOutput, "duplicate-stderr-filters", "", "the same for stderr"),
		stringFlag(catOutput, "logs-specs", "", "torchrun's torchrun.logs_specs plugin name: accepted and ignored with a warning (gorun loads no Python plugins)"),
		stringFlag(catOutput, "event-log-handler", "null", "torchrun's event handler: null, console or dynamic_rendezvous; gorun logs its own events on stderr"),
		stringFlag(catOutput, "metrics-addr", "", "serve this agent's Prometheus metrics at http://HOST:PORT/metrics (e.g. 0.0.0.0:9400; port 0: a free one, logged): job and round state, restarts, node losses, rendezvous time, per worker step, loss, tokens/s, MFU, heartbeat age, exit code"),
		stringFlag(catOutput, "log-format", "auto", "gorun's own log lines: auto (console on a terminal, else JSON), console, json"),
		stringFlag(catOutput, "log-level", "info", "debug, info, warn, error"),
	}
}

// NewApp builds the gorun command line. Run it with app.Run(args); it never
// calls os.Exit: errors carry their exit status as a cli.ExitCoder.
func NewApp() *cli.App {
	app := &cli.App{
		Name:      "gorun",
		Usage:     "start, watch and restart distributed training workers (torchrun-compatible, SLURM-native)",
		UsageText: "gorun [flags] train.toml [--set section.key=value ...]\ngorun [flags] script.py [args...]\ngorun [flags] --no-python program [args...]\ngorun [flags] -- program [args...]",
		Flags:     launchFlags(),
		Action:    runAction,
		Commands: []*cli.Command{
			{
				Name:      "plan",
				Usage:     "print, as JSON, what gorun would launch here, with every worker's environment",
				UsageText: "gorun plan [flags] ENTRYPOINT [args...]",
				Flags:     launchFlags(),
				Action:    planAction,
				// The launch's own flags: the same errors as gorun's.
				OnUsageError: onUsageError,
			},
			benchCommand(),
			statusCommand(),
			metricsCommand(),
			rendezvousCommand(),
			estimateCommand(),
			ckptCommand(),
			sbatchCommand(),
			workerCommand(),
			{
				Name:  "job-secret",
				Usage: "print a fresh job secret (256 random bits in hex) for GORUN_JOB_SECRET or --job-secret-file; or, with --etcdctl, what etcdctl needs to reach a job's etcd",
				UsageText: "export GORUN_JOB_SECRET=$(gorun job-secret)\n(umask 077; gorun job-secret > ~/.gorun-secret)\n" +
					"GORUN_JOB_SECRET=... gorun job-secret --etcdctl DIR --endpoint HOST:PORT   # writes DIR/ca.pem, client.pem, client-key.pem, password; prints the etcdctl command",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "etcdctl", Usage: "DIR: write the job's CA, client certificate and key and etcd password (all mode 600) there for the job secret given (GORUN_JOB_SECRET or --job-secret-file), and print the etcdctl command line that uses them"},
					&cli.StringFlag{Name: "endpoint", Usage: "HOST:PORT,... of the job's etcd, for the printed etcdctl line (default: the embedded etcd's, inside a SLURM job)"},
					&cli.StringFlag{Name: "job-secret-file", Usage: "FILE (mode 600) holding the job secret, for --etcdctl; else GORUN_JOB_SECRET"},
				},
				Action: jobSecretAction,
			},
			{
				Name:   guardCommand,
				Usage:  "internal: kill the workers' process groups named on stdin once stdin closes (gorun died)",
				Hidden: true,
				Action: func(*cli.Context) error { return proc.RunGuard(os.Stdin) },
			},
			{
				Name:      "hostnames",
				Usage:     "expand a SLURM hostlist, one host a line (as scontrol show hostnames)",
				UsageText: "gorun hostnames 'node[01-04],gpu[1-2]'",
				Action:    hostnamesAction,
			},
		},
		HideHelpCommand: true,
		ExitErrHandler:  func(*cli.Context, error) {}, // main maps errors to exit codes
		OnUsageError:    onUsageError,
	}
	return app
}

// runApp runs app on the command line argv (argv[0] is the program) after
// reading the launch flags of gorun and `gorun plan` as torchrun's argparse
// does (torchrunArgv). Its error carries the exit status, as app.Run's.
func runApp(ctx context.Context, app *cli.App, argv []string) error {
	argv, err := torchrunArgv(argv, app.Commands)
	if err != nil {
		return err
	}
	return app.RunContext(ctx, argv)
}

// torchrunArgv rewrites the launch flags of argv (gorun's own, and those
// of `gorun plan`) as torchrun's argparse reads them
// (launcher.ExpandArgv): abbreviations written out, and the "--" right
// after the entrypoint dropped. Another command's arguments are its own.
func torchrunArgv(argv []string, commands []*cli.Command) ([]string, error) {
	if len(argv) < 2 {
		return argv, nil
	}
	flags := argFlags(launchFlags())
	isCommand := func(name string) bool {
		return slices.ContainsFunc(commands, func(c *cli.Command) bool { return c.HasName(name) })
	}
	a, err := launcher.ExpandArgv(argv[1:], flags)
	if err != nil {
		return nil, cli.Exit(err.Error(), exitUsage)
	}
	if a.Dashed || a.Entry >= len(a.Args) || !isCommand(a.Args[a.Entry]) {
		return append(argv[:1:1], a.DropScriptDash()...), nil
	}
	head := append(argv[:1:1], a.Args[:a.Entry+1]...)
	if a.Args[a.Entry] != "plan" {
		return append(head, a.Args[a.Entry+1:]...), nil
	}
	plan, err := launcher.ExpandArgv(a.Args[a.Entry+1:], flags)
	if err != nil {
		return nil, cli.Exit(err.Error(), exitUsage)
	}
	return append(head, plan.DropScriptDash()...), nil
}

// argFlags lists flags (and the help flag the CLI adds) for
// launcher.ExpandArgv.
func argFlags(flags []cli.Flag) []launcher.ArgFlag {
	out := []launcher.ArgFlag{{Names: []string{"help", "h"}}}
	for _, f := range flags {
		takesValue := true
		if v, ok := f.(interface{ TakesValue() bool }); ok {
			takesValue = v.TakesValue()
		}
		out = append(out, launcher.ArgFlag{Names: f.Names(), Value: takesValue})
	}
	return out
}

// onUsageError turns a flag the parser refused into a one-line error
// with exit status 2, naming the flag as the user writes it (--name).
func onUsageError(_ *cli.Context, err error, _ bool) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		msg = "unknown flag --" + strings.TrimPrefix(name, "-") + " (gorun --help lists the flags)"
	}
	msg = strings.Replace(msg, " for flag -", " for flag --", 1)
	return cli.Exit(msg, exitUsage)
}

// options reads the launch flags of c.
func options(c *cli.Context) launcher.Options {
	args := c.Args().Slice()
	opts := launcher.Options{
		NProcPerNode: c.String("nproc-per-node"), NNodes: c.String("nnodes"),
		NodeRank: c.Int("node-rank"), MasterAddr: c.String("master-addr"), MasterPort: c.Int("master-port"),
		Standalone: c.Bool("standalone"), RdzvBackend: c.String("rdzv-backend"),
		RdzvEndpoint: c.String("rdzv-endpoint"), RdzvID: c.String("rdzv-id"), RdzvConf: c.String("rdzv-conf"),
		MaxRestarts: c.Int("max-restarts"), Role: c.String("role"), LogDir: c.String("log-dir"),
		Tee: c.String("tee"), Redirects: c.String("redirects"), LocalRanksFilter: c.String("local-ranks-filter"),
		NoPython: c.Bool("no-python"), TermTimeout: seconds(c, "term-timeout"), NodeName: c.String("node-name"),
		LocalAddr: c.String("local-addr"), HeartbeatTimeout: seconds(c, "heartbeat-timeout"),
		EvictStragglers: seconds(c, "evict-stragglers"),
		JobSecretFile:   c.String("job-secret-file"), MetricsAddr: c.String("metrics-addr"),
		NoSnapshots: !c.Bool("snapshots"), WarmWorkers: c.Bool("warm-workers"), SnapshotReplicas: c.Int("snapshot-replicas"),
		SnapshotDurable: c.String("snapshot-durable"), SnapshotDurableEvery: c.Int("snapshot-durable-every"),
		SnapshotDurableKeep: c.Int("snapshot-durable-keep"),

		Module: c.Bool("module"), RunPath: c.Bool("run-path"), MonitorInterval: seconds(c, "monitor-interval"),
		StartMethod: c.String("start-method"), EventLogHandler: c.String("event-log-handler"),
		LogsSpecs: c.String("logs-specs"), NumaBinding: c.String("numa-binding"),
		SignalsToHandle: c.String("signals-to-handle"), VirtualLocalRank: c.Bool("virtual-local-rank"),
		DupStdoutFilters: c.String("duplicate-stdout-filters"), DupStderrFilters: c.String("duplicate-stderr-filters"),
	}
	if len(args) > 0 {
		opts.Entrypoint, opts.Args = args[0], args[1:]
	}
	return opts
}

// resolve turns c into a Launch; bad input becomes exit status 2.
func resolve(c *cli.Context) (*launcher.Launch, error) {
	l, err := launcher.Resolve(options(c), launcher.LocalHost())
	var usage *launcher.UsageError
	if errors.As(err, &usage) {
		return nil, cli.Exit(usage.Msg, exitUsage)
	}
	return l, err
}

func runAction(c *cli.Context) error {
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	warnUnknownEnv(log, os.Environ(), c.App.Flags)
	l, err := resolve(c)
	if err != nil {
		return err
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(signals)

	ev := log.Info().Str("component", "launcher").Str("host", l.Host).Int("nproc_per_node", l.NProcPerNode).
		Str("run_id", l.RunID).Str("rendezvous", l.Rendezvous.Backend)
	if l.Rendezvous.Backend == launcher.BackendEtcd {
		ev = ev.Strs("endpoints", l.Rendezvous.Endpoints).Str("nodes", fmt.Sprintf("%d:%d", l.MinNodes, l.MaxNodes))
		if l.StartNodes > l.MinNodes {
			ev = ev.Int("start_nodes", l.StartNodes)
		}
	} else {
		ev = ev.Int("node_rank", l.NodeRank).Int("nodes", l.MinNodes).Str("master", fmt.Sprintf("%s:%d", l.MasterAddr, l.MasterPort))
	}
	ev.Msg("launching")
	for _, n := range l.Notes {
		log.Warn().Str("component", "launcher").Msg(n)
	}
	if l.Unauthenticated() {
		log.Warn().Str("component", "launcher").Msg(launcher.UnauthenticatedWarning)
	}
	rt := launcher.Runtime{Stdout: c.App.Writer, Stderr: c.App.ErrWriter, Stdin: os.Stdin, Signals: signals, Log: log}
	if self, err := os.Executable(); err == nil {
		rt.GuardCommand = []string{self, guardCommand}
	} else {
		log.Warn().Err(err).Msg("no guard process: if gorun is killed with SIGKILL, workers' own children may survive")
	}
	out, err := launcher.Run(c.Context, l, rt)
	if err != nil {
		return cli.Exit(err.Error(), max(out.ExitCode, 1))
	}
	if out.ExitCode != 0 {
		return cli.Exit("", out.ExitCode)
	}
	return nil
}

func planAction(c *cli.Context) error {
	l, err := resolve(c)
	if err != nil {
		return err
	}
	l.PlanEnv()
	l.Redact()
	enc := json.NewEncoder(c.App.Writer)
	enc.SetIndent("", "  ")
	return enc.Encode(l)
}

func jobSecretAction(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit("job-secret: takes no arguments", exitUsage)
	}
	if dir := c.String("etcdctl"); dir != "" {
		return etcdctlFilesAction(c, dir)
	}
	if c.IsSet("endpoint") || c.IsSet("job-secret-file") {
		return cli.Exit("job-secret: --endpoint and --job-secret-file go with --etcdctl", exitUsage)
	}
	s, err := jobsecret.New()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(c.App.Writer, s.Encode())
	return err
}

func hostnamesAction(c *cli.Context) error {
	if c.NArg() == 0 {
		return cli.Exit("hostnames: give a hostlist, e.g. gorun hostnames 'node[1-4]'", exitUsage)
	}
	var hosts []string
	for _, expr := range c.Args().Slice() {
		h, err := slurm.ExpandHostlist(expr)
		if err != nil {
			return cli.Exit(err.Error(), exitUsage)
		}
		hosts = append(hosts, h...)
	}
	for _, h := range hosts {
		fmt.Fprintln(c.App.Writer, h)
	}
	return nil
}

// newLogger builds gorun's own logger on stderr: console lines on a
// terminal (or --log-format=console), JSON lines otherwise.
func newLogger(c *cli.Context) (zerolog.Logger, error) {
	level, err := zerolog.ParseLevel(c.String("log-level"))
	if err != nil || c.String("log-level") == "" {
		return zerolog.Nop(), cli.Exit(fmt.Sprintf("--log-level=%s: want debug, info, warn or error", c.String("log-level")), exitUsage)
	}
	var w io.Writer = c.App.ErrWriter
	f, isFile := c.App.ErrWriter.(*os.File)
	terminal := isFile && isTerminal(f)
	format := c.String("log-format")
	if format == "auto" {
		format = "json"
		if terminal {
			format = "console"
		}
	}
	switch format {
	case "console":
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000", NoColor: !terminal}
	case "json":
	default:
		return zerolog.Nop(), cli.Exit(fmt.Sprintf("--log-format=%s: want auto, console or json", format), exitUsage)
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger(), nil
}

// warnUnknownEnv warns about GORUN_* variables that no flag reads: most
// likely a typo that would otherwise be ignored in silence.
func warnUnknownEnv(log zerolog.Logger, environ []string, flags []cli.Flag) {
	// A gorun started by a worker of another inherits its agent's
	// variables for the workers: they are gorun's own, not typos.
	known := map[string]bool{jobsecret.EnvVar: true, proc.GuardMarkEnv: true, snapshot.EnvDir: true,
		elastic.EnvSnapshotStep: true, elastic.EnvSnapshotReason: true, elastic.EnvSnapshotVerified: true}
	for _, f := range flags {
		if ev, ok := f.(interface{ GetEnvVars() []string }); ok {
			for _, name := range ev.GetEnvVars() {
				known[name] = true
			}
		}
	}
	var unknown []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "GORUN_") && !known[name] {
			unknown = append(unknown, name)
		}
	}
	sort.Strings(unknown)
	for _, name := range unknown {
		log.Warn().Str("variable", name).Msg("unknown GORUN_ variable ignored (gorun --help lists the flags; GORUN_<FLAG> sets one)")
	}
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// etcdctlFilesAction writes what etcdctl needs to reach the etcd of the
// job whose secret the user gives into dir, and prints the command line.
func etcdctlFilesAction(c *cli.Context, dir string) error {
	secret, _, err := launcher.GivenSecret(os.LookupEnv, c.String("job-secret-file"))
	if err != nil {
		return cli.Exit("job-secret: "+err.Error(), exitUsage)
	}
	if secret.IsZero() {
		return cli.Exit("job-secret --etcdctl: give the job's secret (GORUN_JOB_SECRET or --job-secret-file)", exitUsage)
	}
	var endpoints []string
	for _, ep := range strings.Split(c.String("endpoint"), ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			endpoints = append(endpoints, ep)
		}
	}
	if len(endpoints) == 0 {
		if job, underSLURM, err := slurm.FromEnv(os.LookupEnv); err == nil && underSLURM && len(job.Nodes) > 0 {
			endpoints = launcher.PlanEmbedded(job.JobID, job.Nodes).Endpoints
		}
	}
	if len(endpoints) == 0 {
		endpoints = []string{"HOST:PORT"}
	}
	files, err := etcdembed.WriteClientFiles(dir, secret)
	if err != nil {
		return cli.Exit("job-secret: "+err.Error(), 1)
	}
	_, err = fmt.Fprintf(c.App.Writer, "%s get --prefix %s\n", files.EtcdctlShell(endpoints), etcdembed.AuthPrefix)
	return err
}
