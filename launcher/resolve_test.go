package launcher

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/rendezvous"
)

// fakeNames is the resolver of fakeHost: box is this machine (10.0.0.7,
// 192.168.1.7 on its InfiniBand), head another node.
var fakeNames = map[string][]net.IP{
	"box": {net.ParseIP("10.0.0.7")}, "box-ib": {net.ParseIP("192.168.1.7")},
	"head": {net.ParseIP("10.0.0.1")}, "localhost": {net.ParseIP("127.0.0.1")},
}

// fakeHost is a machine named box with the given environment, 8 CPUs, the
// given /dev/nvidia devices, train.py present, python3 on PATH and the
// addresses of fakeNames.
func fakeHost(env map[string]string, devices ...string) Host {
	var environ []string
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	return Host{
		Lookup:   func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		Environ:  environ,
		Hostname: "box",
		NumCPU:   8,
		Glob:     func(string) ([]string, error) { return devices, nil },
		LookPath: func(p string) (string, error) {
			switch p {
			case "python3", "/usr/bin/python3", "true":
				if !strings.HasPrefix(p, "/") {
					p = "/usr/bin/" + p
				}
				return p, nil
			}
			return "", &fs.PathError{Op: "lookpath", Path: p, Err: fs.ErrNotExist}
		},
		Stat: func(p string) (os.FileInfo, error) {
			if p == "train.py" || p == "train.toml" {
				return nil, nil
			}
			return nil, &fs.PathError{Op: "stat", Path: p, Err: fs.ErrNotExist}
		},
		FreePort:   func(string) (int, error) { return 40000, nil },
		Executable: func() (string, error) { return "/opt/gorun", nil },
		ReadFile: func(p string) ([]byte, error) {
			if p == "train.toml" {
				return []byte("[elastic]\nheartbeat_timeout = \"45s\"\n"), nil
			}
			return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
		},
		NewRunID: func() (string, error) { return "gorun-fresh", nil },
		LookupIP: func(name string) ([]net.IP, error) {
			if ips, ok := fakeNames[name]; ok {
				return ips, nil
			}
			return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
		},
		IfaceAddrs: func() ([]net.Addr, error) {
			return []net.Addr{
				&net.IPNet{IP: net.ParseIP("127.0.0.1"), Mask: net.CIDRMask(8, 32)},
				&net.IPNet{IP: net.ParseIP("10.0.0.7"), Mask: net.CIDRMask(24, 32)},
				&net.IPNet{IP: net.ParseIP("192.168.1.7"), Mask: net.CIDRMask(24, 32)},
			}, nil
		},
	}
}

func opts(mod func(*Options)) Options {
	o := Options{NProcPerNode: "2", NodeRank: -1, Entrypoint: "train.py", TermTimeout: time.Second}
	if mod != nil {
		mod(&o)
	}
	return o
}

// slurmStep is node 1 of a 3-node step of job 4242 inside a 4-node job.
func slurmStep() map[string]string {
	return map[string]string{
		"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "node[1-4]",
		"SLURM_NODELIST": "node[1-4]", "SLURM_STEP_NODELIST": "node[2-4]", "SLURM_JOB_NUM_NODES": "4",
		"SLURM_NNODES": "3", "SLURM_STEP_NUM_NODES": "3", "SLURM_NODEID": "1", "SLURM_PROCID": "1",
		"SLURM_LOCALID": "0", "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_TASKS_PER_NODE": "1(x3)",
		"SLURM_TASKS_PER_NODE": "1(x4)", "SLURMD_NODENAME": "node3",
	}
}

func TestResolve(t *testing.T) {
	tests := []struct {
		name  string
		opts  Options
		env   map[string]string
		devs  []string
		check func(t *testing.T, l *Launch)
	}{
		{"one node by default", opts(nil), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, 1, l.MinNodes)
			require.Equal(t, 0, l.NodeRank)
			require.Equal(t, "127.0.0.1", l.MasterAddr)
			require.Equal(t, 40000, l.MasterPort)
			require.Equal(t, []string{"/usr/bin/python3", "-u", "train.py"}, l.Command)
			require.Len(t, l.Workers, 2)
			require.Equal(t, 1, l.Workers[1].Rank)
			require.Equal(t, 2, l.Workers[1].WorldSize)
			require.Equal(t, "gorun-fresh", l.RunID, "one node outside SLURM: a fresh run id")
			require.Equal(t, "gorun-fresh", l.Workers[0].RunID)
		}},
		{"snapshots on by default, one copy", opts(nil), nil, nil, func(t *testing.T, l *Launch) {
			require.True(t, l.Snapshots)
			require.Equal(t, 0, l.SnapshotReplicas, "Options' zero value; the flag's default is 1")
		}},
		{"--snapshot-durable, made absolute", opts(func(o *Options) {
			o.SnapshotDurable, o.SnapshotDurableEvery, o.SnapshotDurableKeep = "/shared/../shared/snaps", 100, 2
		}), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, &DurableSnapshots{Dir: "/shared/snaps", Every: 100, Keep: 2}, l.SnapshotDurable)
		}},
		{"--snapshots=false", opts(func(o *Options) { o.NoSnapshots, o.SnapshotReplicas = true, 2 }), nil, nil, func(t *testing.T, l *Launch) {
			require.False(t, l.Snapshots)
		}},
		{"--rdzv-id names the run", opts(func(o *Options) { o.RdzvID = "mine" }), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, "mine", l.RunID)
			require.Equal(t, "mine", l.Rendezvous.ID)
		}},
		{"one node over etcd gets a fresh run id", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint = "1", "etcd", "127.0.0.1:2379"
		}), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, BackendEtcd, l.Rendezvous.Backend)
			require.Equal(t, "gorun-fresh", l.RunID)
		}},
		{"static nodes share nothing: torchrun's run id", opts(func(o *Options) {
			o.NNodes, o.NodeRank, o.MasterAddr, o.MasterPort = "2", 1, "10.0.0.1", 29500
		}), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, "none", l.RunID)
		}},
		{"standalone honours --master-port", opts(func(o *Options) { o.Standalone, o.MasterPort = true, 29555 }), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, 29555, l.MasterPort)
			require.Equal(t, "127.0.0.1", l.MasterAddr)
			require.Equal(t, 29555, l.Workers[1].MasterPort)
		}},
		{"standalone in a SLURM step honours --master-port", opts(func(o *Options) { o.Standalone, o.MasterPort, o.NNodes = true, 29556, "1" }), slurmStep(), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, 29556, l.MasterPort)
			require.Equal(t, "127.0.0.1", l.MasterAddr, "not the step's first node")
		}},
		{"standalone picks a free port without --master-port", opts(func(o *Options) { o.Standalone = true }), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, 40000, l.MasterPort)
		}},
		{"a requeued SLURM job is a new generation", opts(nil), func() map[string]string {
			env := slurmStep()
			env["SLURM_RESTART_COUNT"] = "2"
			return env
		}(), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, "4242", l.RunID, "same job id, same run id")
			require.Equal(t, 2, l.Rendezvous.Generation)
		}},
		{"static two nodes", opts(func(o *Options) {
			o.NNodes, o.NodeRank, o.MasterAddr, o.MasterPort = "2", 1, "10.0.0.1", 29500
			o.Args = []string{"--lr", "0.1"}
		}), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, 2, l.Workers[0].Rank)
			require.Equal(t, 3, l.Workers[1].Rank)
			require.Equal(t, 4, l.Workers[1].WorldSize)
			require.Equal(t, "10.0.0.1", l.Workers[0].MasterAddr)
			require.Equal(t, 29500, l.Workers[0].MasterPort)
			require.Equal(t, []string{"/usr/bin/python3", "-u", "train.py", "--lr", "0.1"}, l.Command)
		}},
		{"static endpoint is the master", opts(func(o *Options) {
			o.NNodes, o.NodeRank, o.RdzvBackend, o.RdzvEndpoint = "2", 0, "static", "head:29400"
		}), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, BackendStatic, l.Rendezvous.Backend)
			require.Equal(t, "head", l.MasterAddr)
			require.Equal(t, 29400, l.MasterPort)
		}},
		{"c10d endpoint on one node is the master", opts(func(o *Options) {
			o.RdzvBackend, o.RdzvEndpoint = "c10d", "head:29400"
		}), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, BackendStatic, l.Rendezvous.Backend)
			require.Equal(t, "head", l.MasterAddr)
			require.Equal(t, 29400, l.MasterPort)
		}},
		{"c10d endpoint of several nodes is etcd, hosted at the endpoint", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.RdzvID = "2:4", "c10d", "head:29500", "job7"
		}), nil, nil, func(t *testing.T, l *Launch) {
			r := l.Rendezvous
			require.Equal(t, BackendEtcd, r.Backend)
			require.Equal(t, []string{"head:29500"}, r.Endpoints)
			require.Equal(t, []string{"head:29500"}, r.Client.Endpoints)
			require.NotNil(t, r.Embedded)
			require.Equal(t, []EmbeddedMember{{Name: "head", Host: "head", ClientPort: 29500, PeerPort: 29501}}, r.Embedded.Members)
			require.Nil(t, r.Member, "box is not head: a client")
			require.Contains(t, r.Hosting, "run by another node")
			require.Equal(t, -1, l.NodeRank, "ranked in join order")
			require.Equal(t, 4, r.Limits.MaxNodes)
			require.Equal(t, defaultJoinTimeout, r.Client.Patience, "a client waits for the hosting node as long as for the round")
		}},
		{"c10d endpoint of several nodes, this node hosts it", opts(func(o *Options) {
			o.NNodes, o.NodeRank, o.RdzvBackend, o.RdzvEndpoint, o.LocalAddr, o.RdzvID = "3", 0, "c10d", "10.0.0.1", "10.0.0.1", "job7"
			o.RdzvConf = "connect_timeout=45"
		}), nil, nil, func(t *testing.T, l *Launch) {
			r := l.Rendezvous
			require.Equal(t, BackendEtcd, r.Backend)
			require.Equal(t, []string{"10.0.0.1:29400"}, r.Endpoints, "torchrun's default port")
			require.Equal(t, &EmbeddedMember{Name: "10.0.0.1", Host: "10.0.0.1", ClientPort: 29400, PeerPort: 29401}, r.Member)
			require.Contains(t, r.Hosting, "run by this node")
			require.Equal(t, 0, l.NodeRank, "--node-rank is the preferred rank")
			require.Equal(t, 45*time.Second, r.Client.Patience, "connect_timeout wins")
		}},
		{"slurm step is elastic over an embedded etcd", opts(nil), slurmStep(), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, BackendEtcd, l.Rendezvous.Backend)
			require.Equal(t, 1, l.MinNodes, "without --nnodes the job goes on with the nodes left")
			require.Equal(t, 3, l.MaxNodes)
			require.Equal(t, 3, l.StartNodes, "the first round waits for every node of the step")
			require.Equal(t, rendezvous.Limits{MinNodes: 1, MaxNodes: 3, StartNodes: 3, MaxChanges: defaultMaxChanges}, l.Rendezvous.Limits)
			require.Equal(t, 6, l.Workers[0].WorldSize, "the plan shows the first round: every node of the step")
			require.Equal(t, 1, l.NodeRank, "SLURM_NODEID is the preferred rank")
			require.Equal(t, "4242", l.RunID)
			require.Equal(t, "node3", l.Host)
			require.NotNil(t, l.Rendezvous.Embedded)
			require.Len(t, l.Rendezvous.Embedded.Members, 3, "three members on the step's first three nodes")
			require.Equal(t, "node2", l.Rendezvous.Embedded.Members[0].Host, "the step's nodes, not the job's")
			require.Equal(t, l.Rendezvous.Embedded.Endpoints, l.Rendezvous.Endpoints)
			require.NotNil(t, l.Rendezvous.Member, "node3 runs the second member")
			require.Equal(t, "node3", l.Rendezvous.Member.Host)
			require.Empty(t, l.Rendezvous.Hosting)
			require.Equal(t, Duration(defaultLeaseTTL), l.Rendezvous.Timing.LeaseTTL)
			require.Equal(t, 2, l.Workers[0].Rank)
		}},
		{"slurm step, static", opts(func(o *Options) { o.RdzvBackend = "static" }), slurmStep(), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, BackendStatic, l.Rendezvous.Backend)
			require.Equal(t, "node2", l.MasterAddr, "master is the step's first node, not the job's")
			require.Equal(t, 15000+4242, l.MasterPort)
			require.Equal(t, 2, l.Workers[0].Rank)
			require.Equal(t, 6, l.Workers[0].WorldSize)
		}},
		{"slurm static with flags over it", opts(func(o *Options) { o.RdzvBackend, o.MasterPort, o.NodeName = "static", 1234, "n3-ib" }), slurmStep(), nil, func(t *testing.T, l *Launch) {
			require.Equal(t, 1234, l.MasterPort)
			require.Equal(t, "n3-ib", l.Host)
		}},
		{"etcd endpoint with an elastic range", opts(func(o *Options) {
			o.NNodes, o.RdzvEndpoint, o.LocalAddr, o.RdzvID = "2:3", "127.0.0.1:2379", "127.0.0.1", "job-7"
			o.RdzvConf = "lease_ttl=7,last_call_timeout=2s,join_timeout=1m,max_membership_changes=4"
		}), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, BackendEtcd, l.Rendezvous.Backend)
			require.Equal(t, []string{"127.0.0.1:2379"}, l.Rendezvous.Endpoints)
			require.Nil(t, l.Rendezvous.Embedded)
			require.Equal(t, -1, l.NodeRank, "ranked in join order")
			require.Equal(t, "127.0.0.1", l.Addr)
			require.Equal(t, Duration(7*time.Second), l.Rendezvous.Timing.LeaseTTL)
			require.Equal(t, Duration(2*time.Second), l.Rendezvous.Timing.LastCall)
			require.Equal(t, Duration(time.Minute), l.Rendezvous.Timing.JoinTimeout)
			require.Equal(t, 4, l.Rendezvous.Limits.MaxChanges)
			require.Equal(t, 2, l.Rendezvous.Limits.MinNodes)
			require.Equal(t, 3, l.Rendezvous.Limits.MaxNodes)
		}},
		{"auto takes GPUs from SLURM", opts(func(o *Options) { o.NProcPerNode = "auto" }),
			map[string]string{"SLURM_STEP_GPUS": "2,3", "SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_NODELIST": "a", "SLURM_NNODES": "1", "SLURM_NODEID": "0"},
			nil, func(t *testing.T, l *Launch) {
				require.Equal(t, 2, l.NProcPerNode)
				require.Nil(t, l.Workers[1].VisibleGPUs, "gorun never invents CUDA_VISIBLE_DEVICES: SLURM's own (or its cgroup) is the truth")
			}},
		{"auto keeps an inherited CUDA_VISIBLE_DEVICES", opts(func(o *Options) { o.NProcPerNode = "auto" }),
			map[string]string{"CUDA_VISIBLE_DEVICES": "0,1,2"}, []string{"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3"}, func(t *testing.T, l *Launch) {
				require.Equal(t, 3, l.NProcPerNode)
				require.Nil(t, l.Workers[0].VisibleGPUs)
			}},
		{"gpu counts an inherited CUDA_VISIBLE_DEVICES on a ROCm machine", opts(func(o *Options) { o.NProcPerNode = "gpu" }),
			map[string]string{"CUDA_VISIBLE_DEVICES": "0,1"}, []string{"/dev/kfd"}, func(t *testing.T, l *Launch) {
				require.Equal(t, 2, l.NProcPerNode)
			}},
		{"auto with CUDA_VISIBLE_DEVICES but no GPU counts CPUs, as torchrun", opts(func(o *Options) { o.NProcPerNode = "auto" }),
			map[string]string{"CUDA_VISIBLE_DEVICES": "0,1,2"}, nil, func(t *testing.T, l *Launch) {
				require.Equal(t, 8, l.NProcPerNode)
				require.Contains(t, strings.Join(l.Notes, "\n"), "--nproc-per-node=auto: CUDA_VISIBLE_DEVICES=0,1,2 lists GPUs, but this machine has none")
			}},
		{"auto from device files", opts(func(o *Options) { o.NProcPerNode = "gpu" }), nil,
			[]string{"/dev/nvidia1", "/dev/nvidia0", "/dev/nvidiactl"}, func(t *testing.T, l *Launch) {
				require.Equal(t, 2, l.NProcPerNode)
				require.Equal(t, []string{"0", "1"}, l.GPUs)
			}},
		{"auto without GPUs is CPUs", opts(func(o *Options) { o.NProcPerNode = "auto" }), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, 8, l.NProcPerNode)
		}},
		{"auto without GPUs for train.toml is one worker", opts(func(o *Options) { o.NProcPerNode, o.Entrypoint = "auto", "train.toml" }), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, 1, l.NProcPerNode, "its threads take every CPU")
		}},
		{"cpu for train.toml is one worker per CPU", opts(func(o *Options) { o.NProcPerNode, o.Entrypoint = "cpu", "train.toml" }), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, 8, l.NProcPerNode)
		}},
		{"program", opts(func(o *Options) { o.Entrypoint, o.Args = "true", []string{"x"} }), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, []string{"/usr/bin/true", "x"}, l.Command)
		}},
		{"batch script of a one-node job with several tasks", opts(nil),
			map[string]string{"SLURM_JOB_ID": "7", "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "4", "SLURM_NTASKS": "4"},
			nil, func(t *testing.T, l *Launch) {
				require.Equal(t, 1, l.MinNodes)
				require.Equal(t, "n1", l.MasterAddr)
			}},
		{"train.toml runs the embedded trainer", opts(func(o *Options) { o.Entrypoint, o.Args = "train.toml", []string{"--set", "train.steps=50"} }), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, []string{"/opt/gorun", "worker", "train.toml", "--set", "train.steps=50"}, l.Command)
			require.Equal(t, Duration(45*time.Second), l.Heartbeat, "[elastic] heartbeat_timeout")
			require.True(t, l.InPlace, "the embedded trainer recovers in place")
		}},
		{"--heartbeat-timeout wins over train.toml", opts(func(o *Options) { o.Entrypoint, o.HeartbeatTimeout = "train.toml", 5*time.Second }), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, Duration(5*time.Second), l.Heartbeat)
		}},
		{"--metrics-addr", opts(func(o *Options) { o.MetricsAddr = "0.0.0.0:9400" }), nil, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, "0.0.0.0:9400", l.MetricsAddr)
		}},
		{"--warm-workers for a script", opts(func(o *Options) { o.WarmWorkers = true }), nil, nil, func(t *testing.T, l *Launch) {
			require.True(t, l.WarmWorkers)
			require.Empty(t, l.Notes)
		}},
		{"--warm-workers without snapshots says so and starts cold", opts(func(o *Options) { o.WarmWorkers, o.NoSnapshots = true, true }), nil, nil, func(t *testing.T, l *Launch) {
			require.False(t, l.WarmWorkers)
			require.Contains(t, strings.Join(l.Notes, "\n"), "--warm-workers needs --snapshots")
		}},
		{"--warm-workers for a program says so and starts cold", opts(func(o *Options) { o.WarmWorkers, o.Entrypoint = true, "true" }), nil, nil, func(t *testing.T, l *Launch) {
			require.False(t, l.WarmWorkers)
			require.Contains(t, strings.Join(l.Notes, "\n"), `--warm-workers: "/usr/bin/true" is not a Python interpreter`)
		}},
		{"--warm-workers for train.toml says so", opts(func(o *Options) { o.WarmWorkers, o.Entrypoint = true, "train.toml" }), nil, nil, func(t *testing.T, l *Launch) {
			require.False(t, l.WarmWorkers)
			require.Contains(t, strings.Join(l.Notes, "\n"), "is not a Python interpreter")
		}},
		{"PYTHON picks the interpreter", opts(nil), map[string]string{"PYTHON": "/usr/bin/python3"}, nil, func(t *testing.T, l *Launch) {
			require.Equal(t, "/usr/bin/python3", l.Command[0])
			require.False(t, l.InPlace, "a script is restarted, never kept")
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Resolve(tc.opts, fakeHost(tc.env, tc.devs...))
			require.NoError(t, err)
			tc.check(t, l)
		})
	}
}

func TestResolveErrors(t *testing.T) {
	withEnv := func(mod func(map[string]string)) map[string]string {
		env := slurmStep()
		mod(env)
		return env
	}
	tests := []struct {
		name string
		opts Options
		env  map[string]string
		want string
	}{
		{"nnodes range backwards", opts(func(o *Options) { o.NNodes = "3:2" }), nil, "MIN 3 is larger than MAX 2"},
		{"nnodes not a number", opts(func(o *Options) { o.NNodes = "x" }), nil, "--nnodes=x"},
		{"elastic range without etcd", opts(func(o *Options) { o.NNodes = "1:4" }), nil, "an elastic range needs an etcd"},
		{"elastic range with c10d without endpoint", opts(func(o *Options) { o.NNodes, o.RdzvBackend = "1:4", "c10d" }), nil, "needs --rdzv-backend=etcd"},
		{"elastic range with static", opts(func(o *Options) { o.NNodes, o.RdzvBackend, o.RdzvEndpoint = "1:4", "static", "head:1" }), nil, "needs --rdzv-backend=etcd"},
		{"c10d with two endpoints", opts(func(o *Options) { o.NNodes, o.RdzvBackend, o.RdzvEndpoint = "2", "c10d", "head:1,box:1" }), nil, "c10d takes one HOST:PORT"},
		{"c10d endpoint without host", opts(func(o *Options) { o.NNodes, o.RdzvBackend, o.RdzvEndpoint = "2", "c10d", ":29500" }), nil, "no host"},
		{"c10d endpoint at the last port", opts(func(o *Options) { o.NNodes, o.RdzvBackend, o.RdzvEndpoint = "2", "c10d", "head:65535" }), nil, "port+1"},
		{"c10d endpoint that does not resolve", opts(func(o *Options) { o.NNodes, o.RdzvBackend, o.RdzvEndpoint = "2", "c10d", "nowhere:29500" }), nil, "cannot resolve nowhere"},
		{"c10d is_host not a bool", opts(func(o *Options) {
			o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.RdzvConf = "2", "c10d", "head:1", "is_host=maybe"
		}), nil, "is_host=maybe: want true or false"},
		{"is_host without c10d", opts(func(o *Options) { o.NNodes, o.RdzvEndpoint, o.RdzvConf = "2", "head:1", "is_host=1" }), nil, "only --rdzv-backend=c10d"},
		{"etcd without endpoint", opts(func(o *Options) { o.NNodes, o.RdzvBackend = "2", "etcd" }), nil, "give --rdzv-endpoint"},
		{"nodes meeting over etcd need a run id", opts(func(o *Options) { o.NNodes, o.RdzvEndpoint = "2:3", "h:1" }), nil, "give every node the same --rdzv-id"},
		{"a run id is a directory name", opts(func(o *Options) { o.RdzvID = "a/b" }), nil, `--rdzv-id="a/b"`},
		{"bad lease ttl", opts(func(o *Options) { o.NNodes, o.RdzvEndpoint, o.RdzvConf = "2", "h:1", "lease_ttl=0.1" }), nil, "lease_ttl=0.1"},
		{"missing script", opts(func(o *Options) { o.Entrypoint = "nope.py" }), nil, "script nope.py: file does not exist"},
		{"missing config", opts(func(o *Options) { o.Entrypoint = "nope.toml" }), nil, "config nope.toml: file does not exist"},
		{"bad config caught before any worker starts", opts(func(o *Options) { o.Entrypoint, o.Args = "train.toml", []string{"--set", "train.steps=-1"} }), nil, "--set train.steps=-1: must be at least 1"},
		{"bad config caught before any worker starts, -set=", opts(func(o *Options) { o.Entrypoint, o.Args = "train.toml", []string{"-set=train.steps=-1"} }), nil, "--set train.steps=-1: must be at least 1"},
		{"bad config caught before any worker starts, -set after a worker flag", opts(func(o *Options) { o.Entrypoint, o.Args = "train.toml", []string{"--profile", "-set", "train.steps=-1"} }), nil, "--set train.steps=-1: must be at least 1"},
		{"--set without its value", opts(func(o *Options) { o.Entrypoint, o.Args = "train.toml", []string{"--set"} }), nil, "train.toml: flag --set needs a value"},
		{"missing program", opts(func(o *Options) { o.Entrypoint = "nope" }), nil, "program nope: not found"},
		{"missing python", opts(nil), map[string]string{"PYTHON": "python9"}, `python interpreter "python9" not found`},
		{"no entrypoint", opts(func(o *Options) { o.Entrypoint = "" }), nil, "no entrypoint"},
		{"bad nproc", opts(func(o *Options) { o.NProcPerNode = "0" }), nil, "--nproc-per-node=0"},
		{"gpu without GPUs", opts(func(o *Options) { o.NProcPerNode = "gpu" }), nil, "no GPUs found"},
		{"gpu with CUDA_VISIBLE_DEVICES on a machine without GPUs", opts(func(o *Options) { o.NProcPerNode = "gpu" }), map[string]string{"CUDA_VISIBLE_DEVICES": "0,1"},
			`--nproc-per-node=gpu: CUDA_VISIBLE_DEVICES=0,1 lists GPUs, but this machine has none (no /dev/nvidia*, nvidiactl or kfd); torchrun refuses it too ("Cuda is not available")`},
		{"multi node needs rank", opts(func(o *Options) { o.NNodes, o.MasterAddr, o.MasterPort = "2", "h", 1 }), nil, "--node-rank"},
		{"static multi node needs rank", opts(func(o *Options) { o.NNodes, o.RdzvBackend = "2", "static" }), nil, "--node-rank"},
		{"multi node needs master", opts(func(o *Options) { o.NNodes, o.NodeRank = "2", 1 }), nil, "--master-addr"},
		{"rank outside nodes", opts(func(o *Options) { o.NNodes, o.NodeRank, o.MasterAddr, o.MasterPort = "2", 2, "h", 1 }), nil, "node rank 2 is outside --nnodes=2"},
		{"standalone with nodes", opts(func(o *Options) { o.NNodes, o.Standalone = "2", true }), nil, "--standalone"},
		{"unknown backend", opts(func(o *Options) { o.RdzvBackend = "zk" }), nil, "--rdzv-backend=zk: want etcd, static or c10d"},
		{"bad rdzv conf", opts(func(o *Options) { o.RdzvConf = "a=1,b" }), nil, `"b" is not key=value`},
		{"bad redirects", opts(func(o *Options) { o.Redirects = "7" }), nil, "--redirects"},
		{"bad ranks filter", opts(func(o *Options) { o.LocalRanksFilter = "0,x" }), nil, "--local-ranks-filter"},
		{"negative restarts", opts(func(o *Options) { o.MaxRestarts = -1 }), nil, "--max-restarts=-1"},
		{"negative snapshot replicas", opts(func(o *Options) { o.SnapshotReplicas = -1 }), nil, "--snapshot-replicas=-1: want 0"},
		{"durable copies every 0 steps", opts(func(o *Options) { o.SnapshotDurable, o.SnapshotDurableKeep = "/shared/snaps", 2 }), nil, "--snapshot-durable-every=0: want 1"},
		{"durable copies, none kept", opts(func(o *Options) { o.SnapshotDurable, o.SnapshotDurableEvery = "/shared/snaps", 100 }), nil, "--snapshot-durable-keep=0: want 1"},
		{"durable copies of no snapshots", opts(func(o *Options) {
			o.SnapshotDurable, o.SnapshotDurableEvery, o.SnapshotDurableKeep, o.NoSnapshots = "/shared/snaps", 100, 2, true
		}), nil, "--snapshots=false turns off"},
		{"metrics addr without port", opts(func(o *Options) { o.MetricsAddr = "0.0.0.0" }), nil, "--metrics-addr=0.0.0.0: want HOST:PORT"},
		{"metrics addr with a bad port", opts(func(o *Options) { o.MetricsAddr = "127.0.0.1:http" }), nil, `port "http" is not 0-65535`},
		{"node id outside nodes", opts(nil), withEnv(func(e map[string]string) { e["SLURM_NODEID"] = "3" }), "SLURM_NODEID"},
		{"malformed nodelist", opts(nil), withEnv(func(e map[string]string) { e["SLURM_STEP_NODELIST"] = "node[3-" }), "SLURM_STEP_NODELIST"},
		{"two tasks per node", opts(nil), withEnv(func(e map[string]string) { e["SLURM_STEP_TASKS_PER_NODE"] = "2(x3)" }), "--ntasks-per-node=1"},
		{"batch script of a multi-node job", opts(nil), withEnv(func(e map[string]string) {
			for k := range e {
				if strings.HasPrefix(k, "SLURM_STEP_") {
					delete(e, k)
				}
			}
			e["SLURM_NNODES"], e["SLURM_NODEID"], e["SLURM_TASKS_PER_NODE"] = "4", "0", "1(x4)"
		}), "batch script"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Resolve(tc.opts, fakeHost(tc.env))
			require.Error(t, err)
			var usage *UsageError
			require.True(t, errors.As(err, &usage), "%T is a usage error", err)
			require.Contains(t, err.Error(), tc.want)
			require.NotContains(t, err.Error(), "\n", "usage errors are one line")
		})
	}
}

// The node that owns a c10d endpoint's address hosts its embedded etcd:
// the rules of ownsEndpoint, on the machine box of fakeHost.
func TestC10dEndpointHost(t *testing.T) {
	tests := []struct {
		name, endpoint, localAddr, conf string
		hosts                           bool
		why                             string
	}{
		{"another node's name", "head:29500", "", "", false, "10.0.0.1 is not this node's"},
		{"this node's name", "box:29500", "", "", true, "host box is this node's name"},
		{"this node's --local-addr", "head:29500", "10.0.0.1", "", true, "10.0.0.1 is this node's --local-addr"},
		{"an address of this node's name", "10.0.0.7:29500", "", "", true, "10.0.0.7 is this node's node name box"},
		{"an address of another interface", "box-ib:29500", "10.0.0.7", "", true, "192.168.1.7 is on one of this machine's interfaces"},
		{"loopback, no --local-addr", "localhost:29500", "", "", true, "127.0.0.1 is loopback"},
		{"loopback of another agent on this machine", "127.0.0.2:29500", "127.0.0.3", "", false, "127.0.0.2 is not this node's --local-addr 127.0.0.3"},
		{"loopback of this agent", "127.0.0.2:29500", "127.0.0.2", "", true, "127.0.0.2 is this node's --local-addr"},
		{"is_host=false wins", "box:29500", "", "is_host=false", false, "is_host=false"},
		{"is_host=true wins", "head:29500", "", "is_host=true", true, "is_host=true"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Resolve(opts(func(o *Options) {
				o.NNodes, o.RdzvBackend, o.RdzvEndpoint, o.LocalAddr, o.RdzvConf, o.RdzvID = "2", "c10d", tc.endpoint, tc.localAddr, tc.conf, "job7"
			}), fakeHost(nil))
			require.NoError(t, err)
			require.Equal(t, BackendEtcd, l.Rendezvous.Backend)
			require.Equal(t, tc.hosts, l.Rendezvous.Member != nil, l.Rendezvous.Hosting)
			require.Contains(t, l.Rendezvous.Hosting, tc.why)
			require.Contains(t, l.Rendezvous.Hosting, fmt.Sprintf("c10d endpoint %s (peers: port 29501)", tc.endpoint))
		})
	}
}

func TestParseNNodes(t *testing.T) {
	for _, tc := range []struct {
		in       string
		min, max int
		ok       bool
	}{{"1", 1, 1, true}, {"2:4", 2, 4, true}, {" 3 ", 3, 3, true}, {"0", 0, 0, false}, {"4:2", 0, 0, false}, {"a:b", 0, 0, false}, {"", 0, 0, false}} {
		min, max, err := ParseNNodes(tc.in)
		if !tc.ok {
			require.Error(t, err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		require.Equal(t, [2]int{tc.min, tc.max}, [2]int{min, max}, tc.in)
	}
}

// A train.toml runs the gorun-worker beside the gorun binary when it is an
// executable of the same build, and `gorun worker` with a note saying why
// otherwise.
func TestTomlWorker(t *testing.T) {
	tests := []struct {
		name     string
		lean     os.FileMode // 0: no gorun-worker file
		builds   map[string]string
		wantLean bool
		wantNote string
	}{
		{"same build", 0o755, map[string]string{"gorun": "m abc", "gorun-worker": "m abc"}, true, ""},
		{"builds unknown (-buildvcs=false)", 0o755, map[string]string{"gorun": "", "gorun-worker": ""}, true, ""},
		{"one build unknown", 0o755, map[string]string{"gorun": "m abc", "gorun-worker": ""}, true, ""},
		{"none beside gorun", 0, nil, false, "there is none in "},
		{"not executable", 0o644, map[string]string{"gorun": "m abc", "gorun-worker": "m abc"}, false, "gorun-worker is not an executable file"},
		{"built apart", 0o755, map[string]string{"gorun": "m abc", "gorun-worker": "m def"}, false,
			`gorun-worker is build "m def", gorun is build "m abc"`},
		{"not a Go binary", 0o755, map[string]string{"gorun": "m abc"}, false, "gorun-worker is not a Go binary gorun can read (not a Go executable)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			self := filepath.Join(dir, "gorun")
			require.NoError(t, os.WriteFile(self, nil, 0o755))
			if tt.lean != 0 {
				require.NoError(t, os.WriteFile(filepath.Join(dir, WorkerBinary), nil, tt.lean))
			}
			host := fakeHost(nil)
			host.Stat = os.Stat
			host.Executable = func() (string, error) { return self, nil }
			host.BuildOf = func(path string) (string, error) {
				if id, ok := tt.builds[filepath.Base(path)]; ok {
					return id, nil
				}
				return "", errors.New("not a Go executable")
			}
			argv, note, err := tomlWorker(host)
			require.NoError(t, err)
			if tt.wantLean {
				require.Equal(t, []string{filepath.Join(dir, WorkerBinary)}, argv)
				require.Empty(t, note)
				return
			}
			require.Equal(t, []string{self, "worker"}, argv)
			require.Contains(t, note, tt.wantNote)
			require.Contains(t, note, "go build -o DIR/ ./cmd/gorun ./cmd/gorun-worker")
		})
	}
}
