package launcher

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// NUMA binding modes, torchrun's --numa-binding (torch/numa/binding.py).
const (
	NumaNode        = "node"         // every CPU of the NUMA node of the worker's GPU
	NumaSocket      = "socket"       // every CPU of the socket of that node
	NumaExclusive   = "exclusive"    // a disjoint share of the node's physical cores per GPU on it
	NumaCoreComplex = "core-complex" // one last-level-cache group of the node per GPU, distinct where possible
)

// Machine is where gorun reads this machine's hardware; tests point the
// roots at fakes.
type Machine struct {
	SysRoot  string // sysfs, "/sys"
	ProcRoot string // procfs, "/proc" (the NVIDIA driver's GPU list)
	DevRoot  string // device files, "/dev"
}

// LocalMachine is this machine's.
func LocalMachine() Machine {
	return Machine{SysRoot: "/sys", ProcRoot: "/proc", DevRoot: "/dev"}
}

// topology reads CPU and GPU placement from a Machine.
type topology struct {
	m       Machine
	allowed map[int]bool // the CPUs gorun's task may use
}

func (t topology) sys(parts ...string) string {
	return filepath.Join(append([]string{t.m.SysRoot}, parts...)...)
}

// readCPUList reads a sysfs CPU list file ("0-3,8").
func readCPUList(path string) ([]int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	cpus, err := parseCPUList(string(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cpus, nil
}

// parseCPUList parses "0-3,8" into sorted CPUs.
func parseCPUList(s string) ([]int, error) {
	var cpus []int
	for part := range strings.SplitSeq(strings.TrimSpace(s), ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || a < 0 || b < a {
			return nil, fmt.Errorf("bad CPU list %q", s)
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
	}
	sort.Ints(cpus)
	return slices.Compact(cpus), nil
}

// formatCPUList writes sorted CPUs as "0-3,8".
func formatCPUList(cpus []int) string {
	var b strings.Builder
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(cpus[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(cpus[j]))
		}
		i = j + 1
	}
	return b.String()
}

// nodeCPUs is the allowed CPUs of NUMA node n.
func (t topology) nodeCPUs(n int) ([]int, error) {
	cpus, err := readCPUList(t.sys("devices/system/node", "node"+strconv.Itoa(n), "cpulist"))
	if err != nil {
		return nil, fmt.Errorf("CPUs of NUMA node %d: %w", n, err)
	}
	return t.onlyAllowed(cpus), nil
}

func (t topology) onlyAllowed(cpus []int) []int {
	var out []int
	for _, c := range cpus {
		if t.allowed[c] {
			out = append(out, c)
		}
	}
	return out
}

// readInt reads a sysfs file holding one integer.
func readInt(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, fmt.Errorf("%s: not an integer: %q", path, bytes.TrimSpace(data))
	}
	return n, nil
}

// nvidiaPCI lists the NVIDIA display controllers' PCI addresses, sorted
// (the order nvidia-smi numbers them).
func (t topology) nvidiaPCI() ([]string, error) {
	dir := t.sys("bus/pci/devices")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("PCI devices: %w", err)
	}
	var addrs []string
	for _, e := range entries {
		vendor, _ := os.ReadFile(filepath.Join(dir, e.Name(), "vendor"))
		class, _ := os.ReadFile(filepath.Join(dir, e.Name(), "class"))
		if strings.TrimSpace(string(vendor)) == "0x10de" && strings.HasPrefix(strings.TrimSpace(string(class)), "0x03") {
			addrs = append(addrs, e.Name())
		}
	}
	sort.Strings(addrs)
	return addrs, nil
}

// driverInfo reads the NVIDIA driver's "Device Minor" and "GPU UUID" of
// the GPU at a PCI address, "" where it cannot.
func (t topology) driverInfo(addr string) (minor, uuid string) {
	f, err := os.Open(filepath.Join(t.m.ProcRoot, "driver/nvidia/gpus", addr, "information"))
	if err != nil {
		return "", ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		switch k = strings.TrimSpace(k); {
		case !ok:
		case k == "Device Minor":
			minor = strings.TrimSpace(v)
		case k == "GPU UUID":
			uuid = strings.TrimSpace(v)
		}
	}
	return minor, uuid
}

// pciOf finds the PCI address of device (a /dev/nvidiaN minor or a GPU
// UUID): from the driver's list where it names it, else, for a minor, the
// minor-th NVIDIA GPU in PCI order.
func (t topology) pciOf(device string, addrs []string) (string, error) {
	for _, a := range addrs {
		minor, uuid := t.driverInfo(a)
		if (minor != "" && minor == device) || (uuid != "" && strings.EqualFold(uuid, device)) {
			return a, nil
		}
	}
	if n, err := strconv.Atoi(device); err == nil && n >= 0 && n < len(addrs) {
		return addrs[n], nil
	}
	return "", fmt.Errorf("GPU %q is not one of the %d NVIDIA GPUs in %s", device, len(addrs), t.sys("bus/pci/devices"))
}

// gpuNodes returns the NUMA node of each device.
func (t topology) gpuNodes(devices []string) ([]int, error) {
	addrs, err := t.nvidiaPCI()
	if err != nil {
		return nil, err
	}
	nodes := make([]int, len(devices))
	for i, d := range devices {
		addr, err := t.pciOf(d, addrs)
		if err != nil {
			return nil, err
		}
		n, err := readInt(t.sys("bus/pci/devices", addr, "numa_node"))
		if err != nil {
			return nil, fmt.Errorf("NUMA node of GPU %s: %w", addr, err)
		}
		nodes[i] = max(n, 0) // -1 on machines with one node
	}
	return nodes, nil
}

// groupBy groups cpus by key, the groups sorted by key.
func groupBy(cpus []int, key func(int) int) [][]int {
	m := map[int][]int{}
	for _, c := range cpus {
		k := key(c)
		m[k] = append(m[k], c)
	}
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	out := make([][]int, len(keys))
	for i, k := range keys {
		out[i] = m[k]
	}
	return out
}

// coreOf is the lowest CPU sharing cpu's physical core (cpu itself when
// sysfs does not say).
func (t topology) coreOf(cpu int) int {
	sib, err := readCPUList(t.sys("devices/system/cpu", "cpu"+strconv.Itoa(cpu), "topology/thread_siblings_list"))
	if err != nil || len(sib) == 0 {
		return cpu
	}
	return sib[0]
}

// cacheOf is the lowest CPU sharing cpu's last-level data or unified
// cache (cpu itself when sysfs does not say).
func (t topology) cacheOf(cpu int) int {
	dir := t.sys("devices/system/cpu", "cpu"+strconv.Itoa(cpu), "cache")
	entries, _ := os.ReadDir(dir)
	best, lowest := -1, cpu
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "index") {
			continue
		}
		typ, _ := os.ReadFile(filepath.Join(dir, e.Name(), "type"))
		if s := strings.TrimSpace(string(typ)); s != "Unified" && s != "Data" {
			continue
		}
		level, err := readInt(filepath.Join(dir, e.Name(), "level"))
		if err != nil || level <= best {
			continue
		}
		shared, err := readCPUList(filepath.Join(dir, e.Name(), "shared_cpu_list"))
		if err != nil || len(shared) == 0 {
			continue
		}
		best, lowest = level, shared[0]
	}
	return lowest
}

// share splits groups (physical cores, in order) evenly into parts and
// returns part i's CPUs; the first parts get one group more when they do
// not divide.
func share(groups [][]int, i, parts int) ([]int, error) {
	per, extra := len(groups)/parts, len(groups)%parts
	if per < 1 {
		return nil, fmt.Errorf("%d physical cores for %d workers", len(groups), parts)
	}
	start := i*per + min(i, extra)
	end := start + per
	if i < extra {
		end++
	}
	var cpus []int
	for _, g := range groups[start:end] {
		cpus = append(cpus, g...)
	}
	sort.Ints(cpus)
	return cpus, nil
}

// bindGPUWorker is the CPUs of the worker whose GPU is CUDA index g, with
// nodes the NUMA node of every visible GPU, as torchrun's mode does.
func (t topology) bindGPUWorker(mode string, g int, nodes []int) ([]int, error) {
	node := nodes[g]
	cpus, err := t.nodeCPUs(node)
	if err != nil {
		return nil, err
	}
	if len(cpus) == 0 {
		return nil, fmt.Errorf("none of NUMA node %d's CPUs is one this task may use", node)
	}
	// The GPUs on the same node, and g's place among them.
	var peers []int
	for i, n := range nodes {
		if n == node {
			peers = append(peers, i)
		}
	}
	rel := slices.Index(peers, g)
	switch mode {
	case NumaNode:
		return cpus, nil
	case NumaSocket:
		socket, err := readInt(t.sys("devices/system/cpu", "cpu"+strconv.Itoa(cpus[0]), "topology/physical_package_id"))
		if err != nil {
			return nil, fmt.Errorf("socket of NUMA node %d: %w", node, err)
		}
		possible, err := readCPUList(t.sys("devices/system/node/possible"))
		if err != nil {
			return nil, fmt.Errorf("NUMA nodes: %w", err)
		}
		var out []int
		for _, n := range possible {
			nc, err := t.nodeCPUs(n)
			if err != nil || len(nc) == 0 {
				continue
			}
			if s, err := readInt(t.sys("devices/system/cpu", "cpu"+strconv.Itoa(nc[0]), "topology/physical_package_id")); err == nil && s == socket {
				out = append(out, nc...)
			}
		}
		sort.Ints(out)
		return out, nil
	case NumaExclusive:
		cpus, err := share(groupBy(cpus, t.coreOf), rel, len(peers))
		if err != nil {
			return nil, fmt.Errorf("NUMA node %d: %w", node, err)
		}
		return cpus, nil
	case NumaCoreComplex:
		groups := groupBy(cpus, t.cacheOf)
		// Larger groups first, then by lowest CPU (torchrun's order).
		sort.SliceStable(groups, func(a, b int) bool { return len(groups[a]) > len(groups[b]) })
		return groups[rel%len(groups)], nil
	}
	return nil, fmt.Errorf("unknown NUMA binding %q", mode)
}

// numaBinding computes each local worker's CPU affinity for mode. With
// GPUs (devices: the machine device of each CUDA index), the worker of
// local rank r is placed by its GPU, CUDA index r, as torchrun does. With
// none, only exclusive is possible: each worker gets a disjoint, even
// share of the task's physical cores. Every set is within allowed (the
// CPUs gorun itself may use) and not empty.
func numaBinding(mode string, m Machine, devices []string, nproc int, allowed []int) ([][]int, error) {
	t := topology{m: m, allowed: map[int]bool{}}
	for _, c := range allowed {
		t.allowed[c] = true
	}
	if len(devices) == 0 {
		if mode != NumaExclusive {
			return nil, usagef("--numa-binding=%s places workers by their GPU, and no GPU was found; for CPU workers give --numa-binding=exclusive (a disjoint share of this task's CPUs each)", mode)
		}
		sorted := slices.Sorted(slices.Values(allowed))
		out := make([][]int, nproc)
		for r := range out {
			cpus, err := share(groupBy(sorted, t.coreOf), r, nproc)
			if err != nil {
				return nil, usagef("--numa-binding=exclusive: this task may use %s: %v; give fewer workers", formatCPUList(sorted), err)
			}
			out[r] = cpus
		}
		return out, nil
	}
	if nproc > len(devices) {
		return nil, usagef("--numa-binding=%s: %d workers but %d GPUs: each worker is placed by the GPU of its local rank", mode, nproc, len(devices))
	}
	nodes, err := t.gpuNodes(devices)
	if err != nil {
		return nil, fmt.Errorf("--numa-binding=%s: %w", mode, err)
	}
	out := make([][]int, nproc)
	for r := range out {
		cpus, err := t.bindGPUWorker(mode, r, nodes)
		if err != nil {
			return nil, fmt.Errorf("--numa-binding=%s for local rank %d (GPU %s): %w", mode, r, devices[r], err)
		}
		out[r] = cpus
	}
	return out, nil
}
