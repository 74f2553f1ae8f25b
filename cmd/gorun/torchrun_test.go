package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/launcher"
)

// planOf is the part of `gorun plan`'s JSON these tests read.
type planOf struct {
	MasterAddr  string   `json:"master_addr"`
	MasterPort  int      `json:"master_port"`
	TermTimeout string   `json:"term_timeout"`
	Command     []string `json:"command"`
	Notes       []string `json:"notes"`
	ShowRanks   []int    `json:"local_ranks_filter"`
	RunID       string   `json:"run_id"`
	MaxRestarts int      `json:"max_restarts"`
	Workers     []any    `json:"workers"`
	Rendezvous  struct {
		Backend string `json:"backend"`
	} `json:"rendezvous"`
}

// optionsOf parses args (flags only) as gorun's launch flags do and
// returns the Options they make.
func optionsOf(t *testing.T, env map[string]string, args ...string) (launcher.Options, error) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	var got launcher.Options
	app := &cli.App{Flags: launchFlags(), Action: func(c *cli.Context) error { got = options(c); return nil },
		Writer: &bytes.Buffer{}, ErrWriter: &bytes.Buffer{}}
	err := app.Run(append([]string{"gorun"}, args...))
	return got, err
}

// Every torchrun flag, under each of its spellings and its PET_ variable,
// with torchrun's value syntax, reaches Options.
func TestTorchrunFlagSpellings(t *testing.T) {
	tests := []struct {
		args  []string
		env   map[string]string
		check func(launcher.Options) bool
	}{
		{[]string{"--nnodes=1:2"}, nil, func(o launcher.Options) bool { return o.NNodes == "1:2" }},
		{nil, map[string]string{"PET_NNODES": "2"}, func(o launcher.Options) bool { return o.NNodes == "2" }},
		{[]string{"--nproc_per_node", "4"}, nil, func(o launcher.Options) bool { return o.NProcPerNode == "4" }},
		{[]string{"--rdzv_backend=c10d", "--rdzv_endpoint=h:1", "--rdzv_id=j", "--rdzv_conf=read_timeout=60"}, nil, func(o launcher.Options) bool {
			return o.RdzvBackend == "c10d" && o.RdzvEndpoint == "h:1" && o.RdzvID == "j" && o.RdzvConf == "read_timeout=60"
		}},
		{nil, map[string]string{"PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "h:1", "PET_RDZV_ID": "j", "PET_RDZV_CONF": "is_host=1"}, func(o launcher.Options) bool {
			return o.RdzvBackend == "c10d" && o.RdzvEndpoint == "h:1" && o.RdzvID == "j" && o.RdzvConf == "is_host=1"
		}},
		{[]string{"--standalone"}, nil, func(o launcher.Options) bool { return o.Standalone }},
		{nil, map[string]string{"PET_STANDALONE": "1"}, func(o launcher.Options) bool { return o.Standalone }},
		{[]string{"--max_restarts=3"}, nil, func(o launcher.Options) bool { return o.MaxRestarts == 3 }},
		{nil, map[string]string{"PET_MAX_RESTARTS": "3"}, func(o launcher.Options) bool { return o.MaxRestarts == 3 }},
		{[]string{"--monitor-interval=5"}, nil, func(o launcher.Options) bool { return o.MonitorInterval == 5*time.Second }},
		{[]string{"--monitor_interval", "0.1"}, nil, func(o launcher.Options) bool { return o.MonitorInterval == 100*time.Millisecond }},
		{nil, map[string]string{"PET_MONITOR_INTERVAL": "5"}, func(o launcher.Options) bool { return o.MonitorInterval == 5*time.Second }},
		{[]string{"--monitor-interval=250ms"}, nil, func(o launcher.Options) bool { return o.MonitorInterval == 250*time.Millisecond }},
		{[]string{"--start-method=fork"}, nil, func(o launcher.Options) bool { return o.StartMethod == "fork" }},
		{[]string{"--start_method", "forkserver"}, nil, func(o launcher.Options) bool { return o.StartMethod == "forkserver" }},
		{nil, map[string]string{"PET_START_METHOD": "spawn"}, func(o launcher.Options) bool { return o.StartMethod == "spawn" }},
		{[]string{"--event_log_handler=console"}, nil, func(o launcher.Options) bool { return o.EventLogHandler == "console" }},
		{nil, map[string]string{"PET_EVENT_LOG_HANDLER": "null"}, func(o launcher.Options) bool { return o.EventLogHandler == "null" }},
		{[]string{"--role=trainer"}, nil, func(o launcher.Options) bool { return o.Role == "trainer" }},
		{nil, map[string]string{"PET_ROLE": "trainer"}, func(o launcher.Options) bool { return o.Role == "trainer" }},
		{[]string{"-m"}, nil, func(o launcher.Options) bool { return o.Module }},
		{[]string{"--module"}, nil, func(o launcher.Options) bool { return o.Module }},
		{nil, map[string]string{"PET_MODULE": "1"}, func(o launcher.Options) bool { return o.Module }},
		{[]string{"--no_python"}, nil, func(o launcher.Options) bool { return o.NoPython }},
		{nil, map[string]string{"PET_NO_PYTHON": "1"}, func(o launcher.Options) bool { return o.NoPython }},
		{[]string{"--run_path"}, nil, func(o launcher.Options) bool { return o.RunPath }},
		{nil, map[string]string{"PET_RUN_PATH": "1"}, func(o launcher.Options) bool { return o.RunPath }},
		{[]string{"--log_dir=/tmp/x"}, nil, func(o launcher.Options) bool { return o.LogDir == "/tmp/x" }},
		{nil, map[string]string{"PET_LOG_DIR": "/tmp/x"}, func(o launcher.Options) bool { return o.LogDir == "/tmp/x" }},
		{[]string{"-r", "3", "-t", "0:1,1:2"}, nil, func(o launcher.Options) bool { return o.Redirects == "3" && o.Tee == "0:1,1:2" }},
		{[]string{"--redirects=1", "--tee=2"}, nil, func(o launcher.Options) bool { return o.Redirects == "1" && o.Tee == "2" }},
		{nil, map[string]string{"PET_REDIRECTS": "3", "PET_TEE": "1"}, func(o launcher.Options) bool { return o.Redirects == "3" && o.Tee == "1" }},
		{[]string{"--local_ranks_filter=0,1"}, nil, func(o launcher.Options) bool { return o.LocalRanksFilter == "0,1" }},
		{nil, map[string]string{"PET_LOCAL_RANKS_FILTER": "0"}, func(o launcher.Options) bool { return o.LocalRanksFilter == "0" }},
		{[]string{"--duplicate_stdout_filters=a,,b", "--duplicate-stderr-filters=c"}, nil, func(o launcher.Options) bool {
			return o.DupStdoutFilters == "a,,b" && o.DupStderrFilters == "c"
		}},
		{nil, map[string]string{"PET_DUPLICATE_STDOUT_FILTERS": "a", "PET_DUPLICATE_STDERR_FILTERS": "b"}, func(o launcher.Options) bool {
			return o.DupStdoutFilters == "a" && o.DupStderrFilters == "b"
		}},
		{[]string{"--node_rank=1", "--master_addr=h", "--master_port=29501", "--local_addr=10.0.0.2"}, nil, func(o launcher.Options) bool {
			return o.NodeRank == 1 && o.MasterAddr == "h" && o.MasterPort == 29501 && o.LocalAddr == "10.0.0.2"
		}},
		{nil, map[string]string{"PET_NODE_RANK": "1", "PET_MASTER_ADDR": "h", "PET_MASTER_PORT": "29501", "PET_LOCAL_ADDR": "a"}, func(o launcher.Options) bool {
			return o.NodeRank == 1 && o.MasterAddr == "h" && o.MasterPort == 29501 && o.LocalAddr == "a"
		}},
		{[]string{"--logs_specs=mine"}, nil, func(o launcher.Options) bool { return o.LogsSpecs == "mine" }},
		{[]string{"--numa_binding=exclusive"}, nil, func(o launcher.Options) bool { return o.NumaBinding == "exclusive" }},
		{[]string{"--numa-binding", "core-complex"}, nil, func(o launcher.Options) bool { return o.NumaBinding == "core-complex" }},
		{nil, map[string]string{"PET_NUMA_BINDING": "node"}, func(o launcher.Options) bool { return o.NumaBinding == "node" }},
		{[]string{"--signals_to_handle=SIGTERM,SIGUSR1"}, nil, func(o launcher.Options) bool { return o.SignalsToHandle == "SIGTERM,SIGUSR1" }},
		{nil, map[string]string{"PET_SIGNALS_TO_HANDLE": "SIGINT"}, func(o launcher.Options) bool { return o.SignalsToHandle == "SIGINT" }},
		{[]string{"--shutdown-timeout=10"}, nil, func(o launcher.Options) bool { return o.TermTimeout == 10*time.Second }},
		{[]string{"--shutdown_timeout", "7"}, nil, func(o launcher.Options) bool { return o.TermTimeout == 7*time.Second }},
		{nil, map[string]string{"PET_SHUTDOWN_TIMEOUT": "12"}, func(o launcher.Options) bool { return o.TermTimeout == 12*time.Second }},
		{nil, map[string]string{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "9"}, func(o launcher.Options) bool { return o.TermTimeout == 9*time.Second }},
		{[]string{"--term-timeout=5s"}, nil, func(o launcher.Options) bool { return o.TermTimeout == 5*time.Second }},
		{[]string{"--term-timeout=5"}, nil, func(o launcher.Options) bool { return o.TermTimeout == 5*time.Second }},
		{nil, nil, func(o launcher.Options) bool {
			return o.TermTimeout == 30*time.Second && o.MonitorInterval == 100*time.Millisecond && o.StartMethod == "spawn" &&
				o.EventLogHandler == "null" && o.SignalsToHandle == "SIGTERM,SIGINT,SIGHUP,SIGQUIT" && !o.Module && !o.VirtualLocalRank
		}},
		{[]string{"--virtual_local_rank"}, nil, func(o launcher.Options) bool { return o.VirtualLocalRank }},
		{nil, map[string]string{"PET_VIRTUAL_LOCAL_RANK": "1"}, func(o launcher.Options) bool { return o.VirtualLocalRank }},
	}
	for _, tc := range tests {
		name := strings.Join(tc.args, " ")
		for k, v := range tc.env {
			name += " " + k + "=" + v
		}
		t.Run(name, func(t *testing.T) {
			o, err := optionsOf(t, tc.env, append(tc.args, "entry")...)
			require.NoError(t, err)
			require.True(t, tc.check(o), "%+v", o)
			require.Equal(t, "entry", o.Entrypoint)
		})
	}
}

// torchrun command lines through `gorun plan`, and their bad values as
// one-line errors with exit status 2.
func TestTorchrunCommandLines(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "train.py")
	require.NoError(t, os.WriteFile(script, nil, 0o644))
	env := map[string]string{"PYTHON": "true"} // any program on PATH stands for the interpreter
	truePath, err := exec.LookPath("true")
	require.NoError(t, err)
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, p planOf)
	}{
		{"stacked single node", []string{"--rdzv_backend", "c10d", "--rdzv_endpoint=localhost:0", "--nnodes=1", "--nproc-per-node=2", "--", "true"}, func(t *testing.T, p planOf) {
			require.Equal(t, "static", p.Rendezvous.Backend)
			require.Equal(t, "localhost", p.MasterAddr)
			require.NotZero(t, p.MasterPort)
		}},
		{"torchtitan's run_train.sh", []string{"--nproc_per_node=2", "--rdzv_backend", "c10d", "--rdzv_endpoint=localhost:0", "--local-ranks-filter", "0", "--role", "rank", "--tee", "3",
			"-m", "torchtitan.train", "--job.config_file", "x.toml"}, func(t *testing.T, p planOf) {
			require.Equal(t, []string{truePath, "-u", "-m", "torchtitan.train", "--job.config_file", "x.toml"}, p.Command)
			require.Equal(t, []int{0}, p.ShowRanks)
		}},
		{"-m -- module", []string{"--standalone", "-m", "--", "pkg.mod", "--flag"}, func(t *testing.T, p planOf) {
			require.Equal(t, []string{truePath, "-u", "-m", "pkg.mod", "--flag"}, p.Command)
		}},
		{"the -- after the module goes, as in torchrun", []string{"--standalone", "-m", "scripts.base_train", "--", "--depth=20", "--", "x"}, func(t *testing.T, p planOf) {
			require.Equal(t, []string{truePath, "-u", "-m", "scripts.base_train", "--depth=20", "--", "x"}, p.Command)
		}},
		{"gorun -- program -- args: the second -- stays", []string{"--standalone", "--", "true", "--", "x"}, func(t *testing.T, p planOf) {
			require.Equal(t, []string{truePath, "--", "x"}, p.Command)
		}},
		{"argparse abbreviations", []string{"--standa", "--nproc=3", "--redirect=3", "--max_r", "2", "--", "true"}, func(t *testing.T, p planOf) {
			require.Len(t, p.Workers, 3)
			require.Equal(t, 2, p.MaxRestarts)
		}},
		{"--run-path", []string{"--standalone", "--run-path", script, "a"}, func(t *testing.T, p planOf) {
			require.Equal(t, []string{truePath, "-u", "-c"}, p.Command[:3])
			require.Equal(t, []string{script, "a"}, p.Command[4:])
		}},
		{"static multi-node, torchrun's port", []string{"--nnodes=2", "--node_rank=1", "--master_addr=127.0.0.1", script}, func(t *testing.T, p planOf) {
			require.Equal(t, 29500, p.MasterPort)
			require.Equal(t, "none", p.RunID)
		}},
		{"c10d without a run id", []string{"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400", "--rdzv-conf=read_timeout=300,use_libuv=1", "--", "true"}, func(t *testing.T, p planOf) {
			require.Equal(t, "etcd", p.Rendezvous.Backend)
			require.Equal(t, "none", p.RunID)
		}},
		{"seconds as torchrun writes them", []string{"--standalone", "--monitor-interval=5", "--shutdown-timeout=12", "--start-method=spawn", "--", "true"}, func(t *testing.T, p planOf) {
			require.Equal(t, "12s", p.TermTimeout)
			require.Empty(t, p.Notes)
		}},
		{"ignored flags are noted", []string{"--standalone", "--logs-specs=x", "--duplicate-stdout-filters=loss", "--", "true"}, func(t *testing.T, p planOf) {
			require.Len(t, p.Notes, 2)
		}},
		{"accepted, for other parts of gorun", []string{"--standalone", "--virtual-local-rank", "--signals-to-handle=SIGTERM,SIGUSR1", "--event-log-handler=null", "--", "true"}, func(t *testing.T, p planOf) {
			require.Empty(t, p.Notes)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, env, append([]string{"plan"}, tc.args...)...)
			require.Equal(t, 0, code, stderr)
			var p planOf
			require.NoError(t, json.Unmarshal([]byte(stdout), &p))
			tc.check(t, p)
		})
	}

	bad := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"monitor interval not a time", nil, []string{"--monitor-interval=soon", "--", "true"}, `"soon" is not a time`},
		{"monitor interval from PET_ not a time", map[string]string{"PET_MONITOR_INTERVAL": "x"}, []string{"--", "true"}, `"x" is not a time`},
		{"negative shutdown timeout", nil, []string{"--shutdown-timeout=-1", "--", "true"}, "negative"},
		{"bad start method", nil, []string{"--start-method=thread", "--", "true"}, "--start-method=thread"},
		{"bad numa binding", nil, []string{"--numa-binding=all", "--", "true"}, "--numa-binding=all"},
		{"bad signal", nil, []string{"--signals-to-handle=SIGNOPE", "--", "true"}, "--signals-to-handle=SIGNOPE"},
		{"bad -r", nil, []string{"-r", "7", "--", "true"}, "--redirects"},
		{"-m with --no-python", nil, []string{"-m", "--no-python", "x"}, "not both"},
		{"ambiguous abbreviation", nil, []string{"--rdzv=x", "--", "true"}, "ambiguous option: --rdzv could match --rdzv-backend, --rdzv_backend, --rdzv-endpoint"},
		{"bad use_libuv", nil, []string{"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400", "--rdzv-conf=use_libuv=perhaps", "--", "true"}, "use_libuv=perhaps"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, tc.env, append([]string{"plan"}, tc.args...)...)
			require.Equal(t, 2, code, stderr)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tc.want)
			require.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
		})
	}
}

// Real runs of torchrun command lines: -m, --run-path and the stacked
// single-node recipe start Python workers that see what torchrun gives
// them.
func TestTorchrunRuns(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on PATH")
	}
	dir := t.TempDir()
	pkg := filepath.Join(dir, "probepkg")
	require.NoError(t, os.MkdirAll(pkg, 0o755))
	probe := "import os, sys\nprint('probe', __name__, os.environ['RANK'], os.environ['WORLD_SIZE'], ' '.join(sys.argv[1:]))\n"
	require.NoError(t, os.WriteFile(filepath.Join(pkg, "__init__.py"), nil, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(pkg, "probe.py"), []byte(probe), 0o644))
	script := filepath.Join(dir, "probe.py")
	require.NoError(t, os.WriteFile(script, []byte(probe), 0o644))
	t.Chdir(dir)
	// asMain: gorun's guard process is this test binary, run as gorun.
	env := map[string]string{"PYTHON": python, "TMPDIR": t.TempDir(), asMain: "1"}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"-m", []string{"--standalone", "--nproc-per-node=2", "-m", "probepkg.probe", "a b", "--c"}},
		{"--run-path", []string{"--standalone", "--nproc-per-node=2", "--run-path", script, "a b", "--c"}},
		{"stacked single node", []string{"--rdzv_backend", "c10d", "--rdzv_endpoint=localhost:0", "--nnodes=1", "--nproc_per_node=2", "--monitor_interval=0.1", script, "a b", "--c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, env, append([]string{"--log-format=json"}, tc.args...)...)
			require.Equal(t, 0, code, "stdout: %s\nstderr: %s", stdout, stderr)
			for _, rank := range []string{"0", "1"} {
				require.Contains(t, stdout, "probe __main__ "+rank+" 2 a b --c", stdout)
			}
		})
	}
}
