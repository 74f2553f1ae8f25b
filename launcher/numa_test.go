package launcher

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/testutil"
)

// roleVar makes the test binary a worker that prints its CPU affinity.
const roleVar = "LAUNCHER_TEST_ROLE"

func TestMain(m *testing.M) {
	if os.Getenv(roleVar) == "affinity" {
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(0, &set); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		var cpus []int
		for c := 0; c < len(set)*64; c++ {
			if set.IsSet(c) {
				cpus = append(cpus, c)
			}
		}
		fmt.Printf("cpus=%s\n", formatCPUList(cpus))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeSys writes files under root: path -> content.
func fakeSys(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(root, p)
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(content+"\n"), 0o644))
	}
}

// fakeMachine is two sockets of two NUMA nodes of four CPUs (two cores
// of two threads, each core pair sharing an L3 cache), with GPUs at PCI
// 1a and 1b on node 0, 8a on node 2 and 8b on node 3, plus an Intel NIC.
// The NVIDIA driver names 8a minor 3 and 8b minor 2.
func fakeMachine(t *testing.T) Machine {
	t.Helper()
	root := t.TempDir()
	m := Machine{SysRoot: filepath.Join(root, "sys"), ProcRoot: filepath.Join(root, "proc"), DevRoot: filepath.Join(root, "dev")}
	files := map[string]string{"devices/system/node/possible": "0-3"}
	for n := 0; n < 4; n++ {
		files[fmt.Sprintf("devices/system/node/node%d/cpulist", n)] = fmt.Sprintf("%d-%d", 4*n, 4*n+3)
	}
	for c := 0; c < 16; c++ {
		core := c &^ 1
		cpu := fmt.Sprintf("devices/system/cpu/cpu%d/", c)
		files[cpu+"topology/thread_siblings_list"] = fmt.Sprintf("%d-%d", core, core+1)
		files[cpu+"topology/physical_package_id"] = strconv.Itoa(c / 8)
		files[cpu+"cache/index0/type"] = "Instruction"
		files[cpu+"cache/index0/level"] = "1"
		files[cpu+"cache/index0/shared_cpu_list"] = strconv.Itoa(c)
		files[cpu+"cache/index3/type"] = "Unified"
		files[cpu+"cache/index3/level"] = "3"
		files[cpu+"cache/index3/shared_cpu_list"] = fmt.Sprintf("%d-%d", core, core+1)
	}
	for addr, node := range map[string]string{"0000:1a:00.0": "0", "0000:1b:00.0": "0", "0000:8a:00.0": "2", "0000:8b:00.0": "3"} {
		dev := "bus/pci/devices/" + addr + "/"
		files[dev+"vendor"], files[dev+"class"], files[dev+"numa_node"] = "0x10de", "0x030200", node
	}
	files["bus/pci/devices/0000:3b:00.0/vendor"] = "0x8086"
	files["bus/pci/devices/0000:3b:00.0/class"] = "0x020000"
	files["bus/pci/devices/0000:3b:00.0/numa_node"] = "1"
	fakeSys(t, m.SysRoot, files)
	fakeSys(t, m.ProcRoot, map[string]string{
		"driver/nvidia/gpus/0000:8a:00.0/information": "Model: H100\nDevice Minor: \t 3\nGPU UUID: GPU-aaaa",
		"driver/nvidia/gpus/0000:8b:00.0/information": "Model: H100\nDevice Minor: \t 2\nGPU UUID: GPU-bbbb",
	})
	return m
}

func cpuRange(lo, hi int) []int {
	var out []int
	for c := lo; c <= hi; c++ {
		out = append(out, c)
	}
	return out
}

func TestNumaBinding(t *testing.T) {
	m := fakeMachine(t)
	all := cpuRange(0, 15)
	gpus := []string{"0", "1", "3", "2"} // CUDA 2 is minor 3 (8a, node 2), CUDA 3 minor 2 (8b, node 3)
	someOfNode0 := append(cpuRange(0, 2), cpuRange(8, 15)...)
	tests := []struct {
		name    string
		mode    string
		devices []string
		nproc   int
		allowed []int
		want    []string // per local rank, as a CPU list
		err     string
	}{
		{"node", NumaNode, gpus, 4, all, []string{"0-3", "0-3", "8-11", "12-15"}, ""},
		{"socket", NumaSocket, gpus, 4, all, []string{"0-7", "0-7", "8-15", "8-15"}, ""},
		{"exclusive splits a node's cores among its GPUs", NumaExclusive, gpus, 4, all, []string{"0-1", "2-3", "8-11", "12-15"}, ""},
		{"core-complex", NumaCoreComplex, gpus, 4, all, []string{"0-1", "2-3", "8-9", "12-13"}, ""},
		{"fewer workers than GPUs", NumaNode, gpus, 1, all, []string{"0-3"}, ""},
		{"UUIDs", NumaNode, []string{"GPU-bbbb"}, 1, all, []string{"12-15"}, ""},
		{"node within the task's CPUs", NumaNode, gpus, 2, someOfNode0, []string{"0-2", "0-2"}, ""},
		{"exclusive within the task's CPUs", NumaExclusive, gpus, 2, someOfNode0, []string{"0-1", "2"}, ""},
		{"core-complex prefers larger caches", NumaCoreComplex, gpus, 2, someOfNode0, []string{"0-1", "2"}, ""},
		{"CPU workers: exclusive shares", NumaExclusive, nil, 3, all, []string{"0-5", "6-11", "12-15"}, ""},
		{"CPU workers: within the task", NumaExclusive, nil, 2, []int{1, 2, 3, 9}, []string{"1-3", "9"}, ""},
		{"CPU workers need exclusive", NumaNode, nil, 2, all, nil, "no GPU was found"},
		{"more CPU workers than cores", NumaExclusive, nil, 9, all, nil, "8 physical cores for 9 workers"},
		{"more workers than GPUs", NumaNode, gpus[:2], 3, all, nil, "3 workers but 2 GPUs"},
		{"unknown GPU", NumaNode, []string{"GPU-zzzz"}, 1, all, nil, `GPU "GPU-zzzz" is not one of the 4 NVIDIA GPUs`},
		{"none of the node allowed", NumaNode, gpus, 1, cpuRange(8, 15), nil, "none of NUMA node 0's CPUs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := numaBinding(tt.mode, m, tt.devices, tt.nproc, tt.allowed)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			var lists []string
			for _, cpus := range got {
				lists = append(lists, formatCPUList(cpus))
			}
			assert.Equal(t, tt.want, lists)
		})
	}
}

func TestNumaBindingNoSysfs(t *testing.T) {
	_, err := numaBinding(NumaNode, Machine{SysRoot: t.TempDir()}, []string{"0"}, 1, []int{0})
	require.ErrorContains(t, err, "PCI devices")
}

func TestParseCPUList(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want []int
		err  bool
	}{
		{"0-3,8\n", []int{0, 1, 2, 3, 8}, false},
		{"5", []int{5}, false},
		{"", nil, false},
		{"3-1", nil, true},
		{"x", nil, true},
	} {
		got, err := parseCPUList(tt.in)
		if tt.err {
			assert.Error(t, err, tt.in)
			continue
		}
		require.NoError(t, err, tt.in)
		assert.Equal(t, tt.want, got, tt.in)
	}
}

func TestGPUs(t *testing.T) {
	noDev := func(string) ([]string, error) { return nil, nil }
	tests := []struct {
		name    string
		env     map[string]string
		dev     []string
		ids     []string
		devices []string
	}{
		{"inherited CUDA_VISIBLE_DEVICES first", map[string]string{"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "0,1,2,3"}, nil, []string{"0", "1"}, []string{"0", "1"}},
		{"SLURM's relative numbers", map[string]string{"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "4,5"}, nil, []string{"0", "1"}, []string{"4", "5"}},
		{"narrowed relative", map[string]string{"CUDA_VISIBLE_DEVICES": "1", "SLURM_STEP_GPUS": "4,5"}, nil, []string{"1"}, []string{"5"}},
		{"narrowed absolute", map[string]string{"CUDA_VISIBLE_DEVICES": "5", "SLURM_STEP_GPUS": "4,5"}, nil, []string{"5"}, []string{"5"}},
		{"empty hides all", map[string]string{"CUDA_VISIBLE_DEVICES": ""}, []string{"/dev/nvidia0"}, nil, nil},
		{"SLURM without CUDA_VISIBLE_DEVICES", map[string]string{"SLURM_JOB_GPUS": "2,3"}, nil, []string{"2", "3"}, []string{"2", "3"}},
		{"device files are counted", nil, []string{"/d/nvidia3", "/d/nvidia2", "/d/nvidiactl"}, []string{"2", "3"}, []string{"2", "3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			glob := noDev
			if tt.dev != nil {
				glob = func(p string) ([]string, error) {
					require.Equal(t, "/d/nvidia[0-9]*", p)
					return tt.dev, nil
				}
			}
			g := findGPUs(func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }, "/d", glob)
			assert.Equal(t, tt.ids, g.IDs)
			assert.Equal(t, tt.devices, g.Devices)
		})
	}
}

// Nothing sets CUDA_VISIBLE_DEVICES unasked, not even with device files
// of host GPUs 2 and 3 (a container); --virtual-local-rank gives each
// worker one GPU and LOCAL_RANK=0.
func TestResolveGPUPlacement(t *testing.T) {
	l, err := Resolve(opts(nil), fakeHost(nil, "/dev/nvidia2", "/dev/nvidia3"))
	require.NoError(t, err)
	for _, w := range l.Workers {
		assert.Nil(t, w.VisibleGPUs)
	}
	l.PlanEnv()
	for _, env := range l.WorkerEnv {
		for _, kv := range env {
			assert.False(t, strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES="), kv)
		}
	}

	l, err = Resolve(opts(func(o *Options) { o.VirtualLocalRank = true }), fakeHost(map[string]string{"CUDA_VISIBLE_DEVICES": "4,6"}))
	require.NoError(t, err)
	l.PlanEnv()
	for r, want := range []string{"4", "6"} {
		v, _ := lookupEnv(l.WorkerEnv[r], "CUDA_VISIBLE_DEVICES")
		assert.Equal(t, want, v)
		v, _ = lookupEnv(l.WorkerEnv[r], "LOCAL_RANK")
		assert.Equal(t, "0", v)
	}
	l, err = Resolve(opts(func(o *Options) { o.VirtualLocalRank = true }), fakeHost(nil))
	require.NoError(t, err)
	assert.Equal(t, [][]string{{"0"}, {"1"}}, l.WorkerGPUs, "torchrun: GPU r when nothing is inherited")
	_, err = Resolve(opts(func(o *Options) { o.VirtualLocalRank, o.NProcPerNode = true, "3" }), fakeHost(map[string]string{"CUDA_VISIBLE_DEVICES": "4,6"}))
	require.ErrorContains(t, err, "local rank 2 but CUDA_VISIBLE_DEVICES=4,6 lists 2 GPUs")
	_, err = Resolve(opts(func(o *Options) { o.NumaBinding = "numa" }), fakeHost(nil))
	require.ErrorContains(t, err, "--numa-binding=numa: want node, socket, exclusive or core-complex")
}

// The workers gorun starts with --numa-binding run on the CPUs near their
// GPU: read with sched_getaffinity in the real worker processes. The fake
// sysfs puts each CPU this test may use on a NUMA node of its own, with
// one GPU there.
func TestNumaBindingWorkers(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	var set unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(0, &set))
	var allowed []int
	for c := 0; c < len(set)*64 && len(allowed) < 2; c++ {
		if set.IsSet(c) {
			allowed = append(allowed, c)
		}
	}
	root := t.TempDir()
	m := Machine{SysRoot: filepath.Join(root, "sys"), ProcRoot: filepath.Join(root, "proc"), DevRoot: filepath.Join(root, "dev")}
	files := map[string]string{}
	var cuda []string
	for i, c := range allowed {
		files[fmt.Sprintf("devices/system/node/node%d/cpulist", i)] = strconv.Itoa(c)
		dev := fmt.Sprintf("bus/pci/devices/0000:%02x:00.0/", 0x10+i)
		files[dev+"vendor"], files[dev+"class"], files[dev+"numa_node"] = "0x10de", "0x030200", strconv.Itoa(i)
		cuda = append(cuda, strconv.Itoa(i))
	}
	fakeSys(t, m.SysRoot, files)
	require.NoError(t, os.MkdirAll(m.DevRoot, 0o755))
	for i := range allowed { // the machine's GPUs, which --nproc-per-node=gpu wants to see
		require.NoError(t, os.WriteFile(filepath.Join(m.DevRoot, fmt.Sprintf("nvidia%d", i)), nil, 0o644))
	}

	env := map[string]string{roleVar: "affinity", "CUDA_VISIBLE_DEVICES": strings.Join(cuda, ",")}
	host := LocalHost()
	host.Machine = m
	host.Lookup = func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	host.Environ = append(os.Environ(), roleVar+"=affinity", "GORACE=atexit_sleep_ms=0")
	l, err := Resolve(Options{
		NProcPerNode: "gpu", NodeRank: -1, Standalone: true, NoPython: true, Entrypoint: self,
		TermTimeout: 5 * time.Second, NumaBinding: NumaNode,
	}, host)
	require.NoError(t, err)
	require.Len(t, l.WorkerCPUs, len(allowed))

	out := &testutil.SyncBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := Run(ctx, l, Runtime{Stdout: out, Stderr: out, Log: zerolog.New(zerolog.NewTestWriter(t))})
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, "output:\n%s", out)
	for r, c := range allowed {
		assert.Contains(t, out.String(), fmt.Sprintf("[%s:%d] cpus=%d\n", l.Host, r, c))
	}
}
