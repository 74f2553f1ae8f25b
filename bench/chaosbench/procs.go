package main

import (
	"slices"
	"syscall"

	"github.com/gorun/gorun/internal/proc/procfs"
)

// readProcs lists every live process (zombies left out: they hold nothing).
func readProcs() []procfs.Process {
	pids, _ := procfs.PIDs()
	var out []procfs.Process
	for _, pid := range pids {
		if p, err := procfs.Stat(pid); err == nil && !p.Zombie() {
			out = append(out, p)
		}
	}
	return out
}

// descendants are the pids of root's live descendants, root left out.
func descendants(root int) []procfs.Process {
	all := readProcs()
	children := map[int][]procfs.Process{}
	for _, p := range all {
		children[p.PPID] = append(children[p.PPID], p)
	}
	var out []procfs.Process
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			out = append(out, c)
			queue = append(queue, c.PID)
		}
	}
	return out
}

// runIDEnv is the variable the launcher sets in every worker's environment to the job's run
// id (--rdzv-id): the agent itself and its guard do not carry it.
const runIDEnv = "TORCHELASTIC_RUN_ID"

// environHas reports whether process pid's environment holds kv ("KEY=VALUE") exactly; a
// process gone (or not ours) has none.
func environHas(pid int, kv string) bool {
	env, err := procfs.Environ(pid)
	return err == nil && slices.Contains(env, kv)
}

// workersOf are the worker processes of job runID under agent pid: the processes of the
// agent's tree whose environment carries TORCHELASTIC_RUN_ID=runID and whose parent's does
// not (a worker's own children inherit the variable; they are not workers). What a worker's
// command line says (gorun-worker, python, a shell) does not matter.
func workersOf(pid int, runID string) []int {
	kv := runIDEnv + "=" + runID
	if environHas(pid, kv) {
		return nil // the agent itself carries it: its workers cannot be told from it
	}
	tagged := map[int]bool{pid: false}
	var out []int
	for _, p := range descendants(pid) { // breadth first: a parent comes before its children
		tagged[p.PID] = environHas(p.PID, kv)
		if tagged[p.PID] && !tagged[p.PPID] {
			out = append(out, p.PID)
		}
	}
	return out
}

// signalTree sends sig to pid and every descendant of it at once (descendants listed first,
// so that none is re-parented away between the listing and the signal).
func signalTree(pid int, sig syscall.Signal) {
	ds := descendants(pid)
	_ = syscall.Kill(pid, sig)
	for _, d := range ds {
		_ = syscall.Kill(d.PID, sig)
	}
}

// killMarked SIGKILLs every live process whose environment carries markerEnv=marker and
// returns how many there were.
func killMarked(marker string) int {
	marked, _ := procfs.Scan(markerEnv + "=" + marker)
	for _, p := range marked {
		_ = syscall.Kill(p.PID, syscall.SIGCONT)
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
	return len(marked)
}
