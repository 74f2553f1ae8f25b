package launcher

import (
	"strconv"
	"strings"
)

// resolvePlacement applies --virtual-local-rank and --numa-binding: the
// GPU and CPUs of each local worker. Without them gorun places nothing:
// the workers inherit CUDA_VISIBLE_DEVICES and the CPU affinity as they
// are.
func (l *Launch) resolvePlacement(opts Options, host Host) error {
	if opts.VirtualLocalRank {
		l.VirtualLocalRank = true
		// torchrun: the worker of local rank r sees the r-th inherited
		// GPU, or GPU r when CUDA_VISIBLE_DEVICES is not set.
		cuda, set := host.Lookup("CUDA_VISIBLE_DEVICES")
		var ids []string
		if set {
			ids = strings.Split(cuda, ",")
		}
		for r := 0; r < l.NProcPerNode; r++ {
			switch {
			case !set:
				l.WorkerGPUs = append(l.WorkerGPUs, []string{strconv.Itoa(r)})
			case r >= len(ids):
				return usagef("--virtual-local-rank: local rank %d but CUDA_VISIBLE_DEVICES=%s lists %d GPUs; give --nproc-per-node=%d or fewer",
					r, cuda, len(ids), len(ids))
			default:
				l.WorkerGPUs = append(l.WorkerGPUs, []string{strings.TrimSpace(ids[r])})
			}
		}
	}
	mode := strings.ToLower(strings.TrimSpace(opts.NumaBinding))
	if mode == "" {
		return nil
	}
	switch mode {
	case NumaNode, NumaSocket, NumaExclusive, NumaCoreComplex:
	default:
		return usagef("--numa-binding=%s: want node, socket, exclusive or core-complex", opts.NumaBinding)
	}
	if host.TaskCPUs == nil {
		return usagef("--numa-binding=%s: the CPUs this task may use are unknown here", mode)
	}
	allowed, err := host.TaskCPUs()
	if err != nil {
		return err
	}
	devices := l.gpuDevices
	if len(devices) == 0 {
		devices = l.GPUs // SLURM_GPUS_ON_NODE: a count only
	}
	if embeddedTrainer(opts) {
		devices = nil // its workers run on CPUs
	}
	if l.WorkerCPUs, err = numaBinding(mode, host.Machine, devices, l.NProcPerNode, allowed); err != nil {
		return err
	}
	l.NumaBinding = mode
	return nil
}
