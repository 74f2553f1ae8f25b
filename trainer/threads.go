package trainer

import "runtime"

// DefaultThreads is the number of kernel goroutines a worker uses when it
// is not told: the CPUs this process may run on (runtime.GOMAXPROCS, which
// follows the CPU affinity mask and any cgroup CPU limit), shared evenly
// by the localWorldSize workers of the node, and at least 1. Under
// gorun --nproc-per-node=auto a train.toml job runs one worker per node,
// so that is every CPU, which bench/threads.sh measured ahead of one
// worker per CPU (docs/trainer.md, "Workers and threads").
//
// OMP_NUM_THREADS is deliberately not read: gorun sets it to 1 for every
// worker (PyTorch's habit, so that N PyTorch workers do not oversubscribe
// the CPUs), which would force the embedded trainer onto one core. The
// worker command's --threads flag is the override.
func DefaultThreads(localWorldSize int) int {
	return max(1, runtime.GOMAXPROCS(0)/max(1, localWorldSize))
}
