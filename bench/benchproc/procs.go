package benchproc

import (
	pythonpkg "github.com/gorun/gorun/python"

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

// Descendants are root's live descendants (zombies left out), breadth first, root left out.
func Descendants(root int) []procfs.Process {
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

// RunIDEnv is the variable the launcher sets in every worker's environment to the job's run
// id (--rdzv-id): the agent itself and its guard do not carry it.
const RunIDEnv = "TORCHELASTIC_RUN_ID"

// environHas reports whether process pid's environment holds kv ("KEY=VALUE") exactly; a
// process gone (or not ours) has none.
func environHas(pid int, kv string) bool {
	env, err := procfs.Environ(pid)
	return err == nil && slices.Contains(env, kv)
}

// WorkersOf are the worker processes of job runID under agent pid: the processes of the
// agent's tree whose environment carries TORCHELASTIC_RUN_ID=runID and whose parent's does
// not (a worker's own children inherit the variable; they are not workers). What a worker's
// command line says (gorun-worker, python, a shell) does not matter. A warm worker still
// waiting for its round (command name pythonpkg.WarmComm) is not one yet.
func WorkersOf(pid int, runID string) []int {
	kv := RunIDEnv + "=" + runID
	if environHas(pid, kv) {
		return nil // the agent itself carries it: its workers cannot be told from it
	}
	tagged := map[int]bool{pid: false}
	var out []int
	for _, p := range Descendants(pid) { // breadth first: a parent comes before its children
		tagged[p.PID] = environHas(p.PID, kv)
		if tagged[p.PID] && !tagged[p.PPID] && p.Comm != pythonpkg.WarmComm {
			out = append(out, p.PID)
		}
	}
	return out
}

// SignalTree sends sig to pid and every descendant of it at once (the descendants listed first,
// so that none is re-parented away between the listing and the signal).
func SignalTree(pid int, sig syscall.Signal) {
	ds := Descendants(pid)
	_ = syscall.Kill(pid, sig)
	for _, d := range ds {
		_ = syscall.Kill(d.PID, sig)
	}
}

// KillMarked SIGCONTs and SIGKILLs every live process whose environment carries kv
// ("KEY=VALUE", the marker a bench sets in what it starts) and returns how many there were.
func KillMarked(kv string) int {
	marked, _ := procfs.Scan(kv)
	for _, p := range marked {
		_ = syscall.Kill(p.PID, syscall.SIGCONT)
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
	return len(marked)
}
