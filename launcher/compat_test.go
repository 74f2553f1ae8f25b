package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/slurm"
)

func TestParseSeconds(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"5", 5 * time.Second, true}, {"0.1", 100 * time.Millisecond, true}, {"0", 0, true}, {" 30 ", 30 * time.Second, true},
		{"100ms", 100 * time.Millisecond, true}, {"1m30s", 90 * time.Second, true},
		{"-1", 0, false}, {"-5s", 0, false}, {"x", 0, false}, {"", 0, false}, {"NaN", 0, false}, {"Inf", 0, false}, {"1e30", 0, false},
	} {
		got, err := ParseSeconds(tc.in)
		if !tc.ok {
			require.Error(t, err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
}

func TestParseSignalsAndFilters(t *testing.T) {
	sigs, err := ParseSignals("SIGTERM, SIGINT,sigusr1,HUP")
	require.NoError(t, err)
	require.Equal(t, []unix.Signal{unix.SIGTERM, unix.SIGINT, unix.SIGUSR1, unix.SIGHUP}, sigs)
	_, err = ParseSignals("SIGTERM,SIGBOGUS")
	require.ErrorContains(t, err, `"SIGBOGUS" is not a signal name`)

	require.Nil(t, ParseFilters(""))
	require.Equal(t, []string{"apple", "orange"}, ParseFilters("apple,orange"))
	require.Equal(t, []string{"a,b", "c"}, ParseFilters("a,,b,c"), "torchrun's ,, is a comma")
}

// Each torchrun command line of the table resolves as torchrun's would,
// or with a note where gorun differs.
func TestTorchrunRecipes(t *testing.T) {
	// slurmOne is a one-node step of job 4243.
	slurmOne := func() map[string]string {
		return map[string]string{
			"SLURM_JOB_ID": "4243", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "node1", "SLURM_NODELIST": "node1",
			"SLURM_STEP_NODELIST": "node1", "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_STEP_NUM_NODES": "1",
			"SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_STEP_NUM_TASKS": "1",
			"SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_TASKS_PER_NODE": "1", "SLURMD_NODENAME": "node1",
		}
	}
	tests := []struct {
		name  string
		opts  Options
		env   map[string]string
		check func(t *testing.T, l *Launch)
	}{
		{"stacked single node: c10d at localhost:0 picks a free port", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint = "1", "c10d", "localhost:0"
		}), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, BackendStatic, l.Rendezvous.Backend)
			require.Equal(t, "localhost", l.MasterAddr)
			require.Equal(t, 40000, l.MasterPort, "the host's free port")
		}},
		{"stacked single node under SLURM: still a free port", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint = "1", "c10d", "localhost:0"
		}), slurmOne(), func(t *testing.T, l *Launch) {
			require.Equal(t, 40000, l.MasterPort)
		}},
		{"static multi-node without --master-port: torchrun's 29500", opts(func(o *Options) {
			o.NNodes, o.NodeRank, o.MasterAddr = "2", 1, "head"
		}), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, BackendStatic, l.Rendezvous.Backend)
			require.Equal(t, "head", l.MasterAddr)
			require.Equal(t, 29500, l.MasterPort)
			require.Equal(t, "none", l.RunID)
		}},
		{"static multi-node, explicit --master-port wins", opts(func(o *Options) {
			o.NNodes, o.NodeRank, o.MasterAddr, o.MasterPort = "2", 1, "head", 1234
		}), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, 1234, l.MasterPort)
		}},
		{"multi-node c10d without --rdzv-id: torchrun's none", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint = "2", "c10d", "head:29400"
		}), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, BackendEtcd, l.Rendezvous.Backend)
			require.Equal(t, "none", l.RunID)
			require.Equal(t, "none", l.Rendezvous.ID)
		}},
		{"c10d without a port: torchrun's 29400", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint = "2", "c10d", "head"
		}), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, []string{"head:29400"}, l.Rendezvous.Endpoints)
		}},
		{"SLURM with --master-addr: static at that master", opts(func(o *Options) { o.MasterAddr = "10.9.9.9" }), slurmStep(), func(t *testing.T, l *Launch) {
			require.Equal(t, BackendStatic, l.Rendezvous.Backend)
			require.Equal(t, "10.9.9.9", l.MasterAddr)
			require.Equal(t, slurm.JobPorts("4242").Master, l.MasterPort)
			require.Equal(t, 1, l.NodeRank, "SLURM_NODEID")
			require.Len(t, l.Notes, 1)
			require.Contains(t, l.Notes[0], "static rendezvous at the given master")
		}},
		{"SLURM with --master-port: static at the step's first node", opts(func(o *Options) { o.MasterPort = 29555 }), slurmStep(), func(t *testing.T, l *Launch) {
			require.Equal(t, BackendStatic, l.Rendezvous.Backend)
			require.Equal(t, "node2", l.MasterAddr)
			require.Equal(t, 29555, l.MasterPort)
		}},
		{"SLURM without them: elastic etcd", opts(nil), slurmStep(), func(t *testing.T, l *Launch) {
			require.Equal(t, BackendEtcd, l.Rendezvous.Backend)
			require.Empty(t, l.Notes)
		}},
		{"c10d with --master-addr: ignored with a note, as torchrun", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.MasterAddr = "2", "c10d", "head:29400", "x"
		}), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, BackendEtcd, l.Rendezvous.Backend)
			require.Len(t, l.Notes, 1)
			require.Contains(t, l.Notes[0], "--master-addr/--master-port ignored")
		}},
		{"torchrun's keep-alives make the lease TTL", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.RdzvConf = "2", "c10d", "head:29400", "keep_alive_interval=2,keep_alive_max_attempt=4"
		}), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, Duration(8*time.Second), l.Rendezvous.Timing.LeaseTTL)
		}},
		{"keep_alive_interval alone: torchrun's 3 attempts", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.RdzvConf = "2", "c10d", "head:29400", "keep_alive_interval=5"
		}), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, Duration(15*time.Second), l.Rendezvous.Timing.LeaseTTL)
		}},
		{"lease_ttl wins over keep-alives", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.RdzvConf = "2", "c10d", "head:29400", "keep_alive_interval=5,lease_ttl=7"
		}), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, Duration(7*time.Second), l.Rendezvous.Timing.LeaseTTL)
		}},
		{"torchrun's other c10d keys are accepted", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint = "2", "c10d", "head:29400"
			o.RdzvConf = "read_timeout=300,close_timeout=30,heartbeat_timeout=5,use_libuv=0,store_type=tcp,join_timeout=900,last_call_timeout=10"
		}), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, Duration(defaultLeaseTTL), l.Rendezvous.Timing.LeaseTTL)
			require.Equal(t, Duration(900*time.Second), l.Rendezvous.Timing.JoinTimeout)
			require.Equal(t, Duration(10*time.Second), l.Rendezvous.Timing.LastCall)
		}},
		{"torchrun's etcd-v2 TLS keys", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.RdzvID = "2", "etcd-v2", "head:2379", "j"
			o.RdzvConf = "protocol=https,ssl_cert=/c.pem,ssl_cert_key=/k.pem,ca_cert=/ca.pem,read_timeout=60"
		}), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, "/c.pem", l.Rendezvous.Client.Cert)
			require.Equal(t, "/k.pem", l.Rendezvous.Client.Key)
			require.Equal(t, "/ca.pem", l.Rendezvous.Client.CACert)
		}},
		{"the heuristic host may fall back to client", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint = "2", "c10d", "box:29400"
		}), nil, func(t *testing.T, l *Launch) {
			require.NotNil(t, l.Rendezvous.Member)
			require.True(t, l.Rendezvous.HostGuessed)
		}},
		{"an explicit is_host is obeyed, no fallback", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.RdzvConf = "2", "c10d", "head:29400", "is_host=yes"
		}), nil, func(t *testing.T, l *Launch) {
			require.NotNil(t, l.Rendezvous.Member)
			require.False(t, l.Rendezvous.HostGuessed)
		}},
		{"-m runs python -u -m MODULE", opts(func(o *Options) {
			o.Module, o.Entrypoint, o.Args = true, "torchtitan.train", []string{"--job.config_file", "x.toml"}
		}), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, []string{"/usr/bin/python3", "-u", "-m", "torchtitan.train", "--job.config_file", "x.toml"}, l.Command)
			require.False(t, l.InPlace)
		}},
		{"-m with a module named like a config", opts(func(o *Options) { o.Module, o.Entrypoint = true, "train.toml" }), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, []string{"/usr/bin/python3", "-u", "-m", "train.toml"}, l.Command, "not the embedded trainer")
			require.False(t, l.InPlace)
		}},
		{"--run-path runs runpy.run_path", opts(func(o *Options) { o.RunPath, o.Args = true, []string{"a"} }), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, []string{"/usr/bin/python3", "-u", "-c", runPathCode, "train.py", "a"}, l.Command)
		}},
		{"--run-path wins over --no-python and -m", opts(func(o *Options) { o.RunPath, o.NoPython, o.Module = true, true, true }), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, "-c", l.Command[2])
		}},
		{"accepted flags with no effect", opts(func(o *Options) {
			o.StartMethod, o.EventLogHandler, o.MonitorInterval = "forkserver", "null", 5*time.Second
			o.SignalsToHandle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
		}), nil, func(t *testing.T, l *Launch) {
			require.Empty(t, l.Notes)
		}},
		{"an endpoint with no backend and node ranks is torchrun's static default, at the endpoint", opts(func(o *Options) {
			o.NNodes, o.NodeRank, o.RdzvEndpoint = "2", 1, "head:29555"
		}), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, BackendStatic, l.Rendezvous.Backend)
			require.Equal(t, "head", l.MasterAddr)
			require.Equal(t, 29555, l.MasterPort)
			require.Equal(t, 1, l.NodeRank)
			require.Equal(t, "none", l.RunID)
		}},
		{"the same under srun", opts(func(o *Options) { o.NNodes, o.NodeRank, o.RdzvEndpoint = "3", 2, "head:29555" }), slurmStep(), func(t *testing.T, l *Launch) {
			require.Equal(t, BackendStatic, l.Rendezvous.Backend)
			require.Equal(t, "head:29555", fmt.Sprintf("%s:%d", l.MasterAddr, l.MasterPort))
			require.Equal(t, 2, l.NodeRank)
		}},
		{"nodes without ranks meet over the etcd at the endpoint (torchrun's static would rank each 0)", opts(func(o *Options) {
			o.NNodes, o.RdzvEndpoint, o.RdzvID = "2", "head:2379", "j"
		}), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, BackendEtcd, l.Rendezvous.Backend)
			require.Equal(t, []string{"head:2379"}, l.Rendezvous.Endpoints)
		}},
		{"static: the endpoint is the master, not --master-addr/--master-port, as torchrun", opts(func(o *Options) {
			o.NNodes, o.NodeRank, o.RdzvBackend, o.RdzvEndpoint, o.MasterAddr, o.MasterPort = "2", 0, "static", "head:29555", "other", 1234
		}), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, "head:29555", fmt.Sprintf("%s:%d", l.MasterAddr, l.MasterPort))
			require.Contains(t, strings.Join(l.Notes, "\n"), "--master-addr/--master-port ignored: the master of the static rendezvous is --rdzv-endpoint=head:29555")
		}},
		{"c10d ignores timeout, as torchrun's: join_timeout stays 600 s", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.RdzvConf = "1:2", "c10d", "head:29400", "timeout=5"
		}), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, Duration(defaultJoinTimeout), l.Rendezvous.Timing.JoinTimeout)
			require.NotContains(t, l.Rendezvous.Conf, "timeout")
			require.Contains(t, strings.Join(l.Notes, "\n"), "--rdzv-conf timeout=5 ignored, as torchrun's c10d rendezvous ignores it: join_timeout sets")
		}},
		{"torchrun's etcd rendezvous reads timeout as its join timeout", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.RdzvID, o.RdzvConf = "1:2", "etcd", "head:2379", "j", "timeout=5"
		}), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, Duration(5*time.Second), l.Rendezvous.Timing.JoinTimeout)
			require.Empty(t, l.Notes)
		}},
		{"unknown keys are ignored with a note, as torchrun ignores them; quotes stay in the keys and values", opts(func(o *Options) {
			// PyTorch's own c10d test: --rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5' in a Python list, no shell to take the quotes.
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.RdzvConf = "1:2", "c10d", "head:29400", "'join_timeout=5,last_call_timeout=1,timeout=5',heartbeat=5"
		}), nil, func(t *testing.T, l *Launch) {
			r := l.Rendezvous
			require.Equal(t, Duration(defaultJoinTimeout), r.Timing.JoinTimeout, "'join_timeout is not join_timeout")
			require.Equal(t, Duration(time.Second), r.Timing.LastCall)
			require.Equal(t, map[string]string{"last_call_timeout": "1"}, r.Conf)
			notes := strings.Join(l.Notes, "\n")
			require.Contains(t, notes, `--rdzv-conf: unknown key "'join_timeout" ignored, as torchrun ignores it`)
			require.Contains(t, notes, "the quotes are part of the key")
			require.Contains(t, notes, `--rdzv-conf: unknown key "heartbeat" ignored`, "torchrun's key is heartbeat_timeout")
			require.Contains(t, notes, "--rdzv-conf timeout=5' ignored")
		}},
		{"flags gorun cannot honour are noted", opts(func(o *Options) {
			o.EventLogHandler, o.LogsSpecs, o.SignalsToHandle = "console", "myspecs", "SIGTERM,SIGALRM"
			o.DupStdoutFilters, o.DupStderrFilters = "loss,,step", "error"
		}), nil, func(t *testing.T, l *Launch) {
			notes := strings.Join(l.Notes, "\n")
			for _, want := range []string{"--event-log-handler=console", "--logs-specs=myspecs ignored", "does not handle SIGALRM",
				"--duplicate-stdout-filters=loss,,step ignored", "--duplicate-stderr-filters=error ignored"} {
				require.Contains(t, notes, want)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Resolve(tc.opts, fakeHost(tc.env))
			require.NoError(t, err)
			tc.check(t, l)
		})
	}
}

func TestTorchrunRecipeErrors(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		env  map[string]string
		want string
	}{
		{"port 0 on several nodes, static", opts(func(o *Options) { o.NNodes, o.NodeRank, o.RdzvBackend, o.RdzvEndpoint = "2", 0, "static", "head:0" }), nil, "port 0 (a free port) works for one node only"},
		{"port 0 on several nodes, c10d", opts(func(o *Options) { o.NNodes, o.RdzvBackend, o.RdzvEndpoint = "2", "c10d", "head:0" }), nil, "port 0 (a free port) works for one node only"},
		{"a bad port", opts(func(o *Options) { o.RdzvBackend, o.RdzvEndpoint = "c10d", "head:70000" }), nil, `port "70000" is not 1-65535`},
		{"an etcd of the user's still needs a run id", opts(func(o *Options) { o.NNodes, o.RdzvBackend, o.RdzvEndpoint = "2", "etcd", "head:2379" }), nil, "give every node the same --rdzv-id"},
		{"multi-node static without a master", opts(func(o *Options) { o.NNodes, o.NodeRank = "2", 1 }), nil, "say --master-addr=127.0.0.1"},
		{"SLURM, etcd by name, with a master", opts(func(o *Options) { o.RdzvBackend, o.MasterAddr = "etcd", "h" }), slurmStep(), "only static rendezvous uses them"},
		{"SLURM, elastic range, with a master", opts(func(o *Options) { o.NNodes, o.MasterPort = "2:3", 29500 }), slurmStep(), "only static rendezvous uses them"},
		{"-m and --no-python", opts(func(o *Options) { o.Module, o.NoPython = true, true }), nil, "give one of them, not both"},
		{"--run-path without the script", opts(func(o *Options) { o.RunPath, o.Entrypoint = true, "nope.py" }), nil, "--run-path script nope.py"},
		{"bad start method", opts(func(o *Options) { o.StartMethod = "thread" }), nil, "--start-method=thread: want spawn, fork, forkserver"},
		{"bad event log handler", opts(func(o *Options) { o.EventLogHandler = "kafka" }), nil, "--event-log-handler=kafka"},
		{"bad numa binding", opts(func(o *Options) { o.NumaBinding = "gpu" }), nil, "--numa-binding=gpu: want node, socket, exclusive or core-complex"},
		{"bad signal", opts(func(o *Options) { o.SignalsToHandle = "SIGTERM,SIGNOPE" }), nil, "--signals-to-handle=SIGTERM,SIGNOPE"},
		{"https without a certificate", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.RdzvID, o.RdzvConf = "2", "etcd-v2", "head:2379", "j", "protocol=https"
		}), nil, "protocol=https: give ca_cert="},
		{"a bad protocol", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.RdzvID, o.RdzvConf = "2", "etcd", "head:2379", "j", "protocol=grpc"
		}), nil, "protocol=grpc: want http or https"},
		{"one file named twice", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.RdzvID, o.RdzvConf = "2", "etcd", "head:2379", "j", "ca_cert=/a,cacert=/b"
		}), nil, "ca_cert=/a and cacert=/b"},
		{"--standalone in a multi-node step", opts(func(o *Options) { o.Standalone = true }), slurmStep(), "this launch has 3 nodes (the SLURM step's nodes): give --nnodes=1"},
		{"--standalone with nodes", opts(func(o *Options) { o.Standalone, o.NNodes = true, "2:4" }), nil, "this launch has 2 to 4 nodes (--nnodes=2:4)"},
		{"negative monitor interval", opts(func(o *Options) { o.MonitorInterval = -time.Second }), nil, "--monitor-interval"},
	}
	for _, key := range []string{"keep_alive_interval=1000000,keep_alive_max_attempt=999999999", "read_timeout=0", "close_timeout=x", "heartbeat_timeout=-1", "store_type=file", "keep_alive_interval=0", "keep_alive_max_attempt=0", "use_libuv=maybe"} {
		k, _, _ := strings.Cut(key, "=")
		tests = append(tests, struct {
			name string
			opts Options
			env  map[string]string
			want string
		}{"rdzv-conf " + key, opts(func(o *Options) { o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.RdzvConf = "2", "c10d", "head:1", key }), nil, "--rdzv-conf " + k})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Resolve(tc.opts, fakeHost(tc.env))
			require.Error(t, err)
			var usage *UsageError
			require.True(t, errors.As(err, &usage), "%T is a usage error: %v", err, err)
			require.Contains(t, err.Error(), tc.want)
			require.NotContains(t, err.Error(), "\n", "usage errors are one line")
		})
	}
}

// An agent that took itself for the host of a c10d endpoint (loopback,
// no --local-addr) whose port another etcd already serves goes on as that
// etcd's client, as torchrun's c10d does when its heuristic host cannot
// bind: the round forms and the worker runs.
func TestC10dHostFallsBackToClient(t *testing.T) {
	srv := etcdtest.Start(t)
	endpoint := strings.TrimPrefix(srv.Endpoints()[0], "http://")
	t.Setenv("TMPDIR", t.TempDir())
	for _, k := range []string{"SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_NODEID", "GORUN_JOB_SECRET"} {
		t.Setenv(k, "")
		require.NoError(t, os.Unsetenv(k))
	}
	host := LocalHost()
	l, err := Resolve(Options{
		NProcPerNode: "1", NNodes: "1:2", NodeRank: -1, RdzvBackend: "c10d", RdzvEndpoint: endpoint,
		RdzvConf: "last_call_timeout=0,join_timeout=60", Entrypoint: "true", TermTimeout: time.Second,
	}, host)
	require.NoError(t, err)
	require.NotNil(t, l.Rendezvous.Member, l.Rendezvous.Hosting)
	require.True(t, l.Rendezvous.HostGuessed)

	var out, logs testutil.SyncBuffer // written by the agent's goroutines and the workers' pumps at once
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, l, Runtime{Stdout: &out, Stderr: &out, Log: zerolog.New(&logs)})
	require.NoError(t, err, "logs: %s\noutput: %s", logs.String(), out.String())
	require.Equal(t, 0, res.ExitCode)
	require.Contains(t, logs.String(), "this node is a client")
}
