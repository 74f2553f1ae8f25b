package launcher

import (
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// gpuSet is what is known about this node's GPUs and where it was learnt.
type gpuSet struct {
	IDs    []string // device ids, in order
	Source string   // the variable or path they came from
	// Inherited: the workers inherit CUDA_VISIBLE_DEVICES from gorun's own
	// environment, so gorun must not set it (SLURM may have renumbered
	// devices inside a cgroup).
	Inherited bool
}

var nvidiaDevice = regexp.MustCompile(`^nvidia([0-9]+)$`)

// findGPUs looks for this node's GPUs in the order SLURM_STEP_GPUS,
// SLURM_JOB_GPUS, SLURM_GPUS_ON_NODE, CUDA_VISIBLE_DEVICES, /dev/nvidiaN.
func findGPUs(lookup func(string) (string, bool), devGlob func(string) ([]string, error)) gpuSet {
	_, cudaSet := lookup("CUDA_VISIBLE_DEVICES")
	for _, name := range []string{"SLURM_STEP_GPUS", "SLURM_JOB_GPUS"} {
		if ids := splitIDs(lookup(name)); len(ids) > 0 {
			return gpuSet{IDs: ids, Source: name, Inherited: cudaSet}
		}
	}
	if s, ok := lookup("SLURM_GPUS_ON_NODE"); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil && n > 0 {
			ids := make([]string, n)
			for i := range ids {
				ids[i] = strconv.Itoa(i)
			}
			return gpuSet{IDs: ids, Source: "SLURM_GPUS_ON_NODE", Inherited: cudaSet}
		}
	}
	if cudaSet {
		ids := splitIDs(lookup("CUDA_VISIBLE_DEVICES"))
		if len(ids) == 1 && ids[0] == "NoDevFiles" {
			ids = nil
		}
		return gpuSet{IDs: ids, Source: "CUDA_VISIBLE_DEVICES", Inherited: true}
	}
	paths, _ := devGlob("/dev/nvidia[0-9]*")
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
	return gpuSet{IDs: ids, Source: "/dev/nvidia*"}
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
