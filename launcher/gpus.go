package launcher

import (
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// gpuSet is what is known about this node's GPUs and where it was learnt.
// gorun never sets CUDA_VISIBLE_DEVICES from it: the workers inherit what
// SLURM, the container or the user set (--virtual-local-rank narrows it).
type gpuSet struct {
	// IDs are the GPUs CUDA will number 0, 1, ...: the entries of an
	// inherited CUDA_VISIBLE_DEVICES, or else the GPUs SLURM listed, or
	// the /dev/nvidiaN minors.
	IDs    []string
	Source string // the variable or path they came from
	// Inherited: CUDA_VISIBLE_DEVICES is set in gorun's environment.
	Inherited bool
	// Devices are, per CUDA index, the device each is on the machine: a
	// /dev/nvidiaN minor ("4") or a UUID ("GPU-..."), for --numa-binding.
	Devices []string
}

var nvidiaDevice = regexp.MustCompile(`^nvidia([0-9]+)$`)

// findGPUs looks for this node's GPUs: an inherited CUDA_VISIBLE_DEVICES
// first (it is what the workers' CUDA will see), then SLURM_STEP_GPUS,
// SLURM_JOB_GPUS, SLURM_GPUS_ON_NODE, and the /dev/nvidiaN files under
// devRoot.
func findGPUs(lookup func(string) (string, bool), devRoot string, glob func(string) ([]string, error)) gpuSet {
	var slurmName string
	var slurmIDs []string
	for _, name := range []string{"SLURM_STEP_GPUS", "SLURM_JOB_GPUS"} {
		if ids := splitIDs(lookup(name)); len(ids) > 0 {
			slurmName, slurmIDs = name, ids
			break
		}
	}
	if cuda, set := lookup("CUDA_VISIBLE_DEVICES"); set {
		ids := splitIDs(cuda, true)
		if len(ids) == 1 && ids[0] == "NoDevFiles" {
			ids = nil
		}
		return gpuSet{IDs: ids, Source: "CUDA_VISIBLE_DEVICES", Inherited: true, Devices: devicesOf(ids, slurmIDs)}
	}
	if slurmIDs != nil {
		return gpuSet{IDs: slurmIDs, Source: slurmName, Devices: slurmIDs}
	}
	if s, ok := lookup("SLURM_GPUS_ON_NODE"); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil && n > 0 {
			ids := make([]string, n)
			for i := range ids {
				ids[i] = strconv.Itoa(i)
			}
			return gpuSet{IDs: ids, Source: "SLURM_GPUS_ON_NODE"}
		}
	}
	paths, _ := glob(filepath.Join(devRoot, "nvidia[0-9]*"))
	var nums []int
	for _, p := range paths {
		if m := nvidiaDevice.FindStringSubmatch(filepath.Base(p)); m != nil {
			n, _ := strconv.Atoi(m[1])
			nums = append(nums, n)
		}
	}
	sort.Ints(nums)
	ids := make([]string, len(nums))
	for i, n := range nums {
		ids[i] = strconv.Itoa(n)
	}
	return gpuSet{IDs: ids, Source: filepath.Join(devRoot, "nvidia*"), Devices: ids}
}

// devicesOf maps the entries of CUDA_VISIBLE_DEVICES to devices of the
// machine. SLURM sets it to the GPUs of SLURM_STEP_GPUS in order, as
// numbers relative to the task's GPUs when its cgroup hides the others:
// with as many entries as SLURM's list, entry i is SLURM's GPU i; an
// entry that is one of SLURM's GPUs is that GPU, and one below the
// count of SLURM's GPUs indexes them. Without SLURM the entries are
// the devices.
func devicesOf(cuda, slurmIDs []string) []string {
	if len(slurmIDs) == 0 {
		return cuda
	}
	if len(cuda) == len(slurmIDs) {
		return slurmIDs
	}
	out := make([]string, len(cuda))
	for i, e := range cuda {
		out[i] = e
		n, err := strconv.Atoi(e)
		if err != nil || containsString(slurmIDs, e) {
			continue
		}
		if n >= 0 && n < len(slurmIDs) {
			out[i] = slurmIDs[n]
		}
	}
	return out
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func splitIDs(s string, ok bool) []string {
	if !ok {
		return nil
	}
	var ids []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			ids = append(ids, f)
		}
	}
	return ids
}

// gpuDevicePatterns are the device files of a machine with a GPU that
// CUDA can use: an NVIDIA GPU or its control device, or AMD's ROCm
// kernel driver (PyTorch's CUDA API runs on ROCm too).
func gpuDevicePatterns(devRoot string) []string {
	return []string{filepath.Join(devRoot, "nvidia[0-9]*"), filepath.Join(devRoot, "nvidiactl"), filepath.Join(devRoot, "kfd")}
}

// hasGPUDevice says whether devRoot holds any of gpuDevicePatterns.
func hasGPUDevice(devRoot string, glob func(string) ([]string, error)) bool {
	for _, p := range gpuDevicePatterns(devRoot) {
		if m, _ := glob(p); len(m) > 0 {
			return true
		}
	}
	return false
}
