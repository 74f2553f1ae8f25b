package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// proc is one process as /proc shows it.
type proc struct{ pid, ppid int }

// readProcs lists every live process (zombies left out: they hold nothing).
func readProcs() []proc {
	entries, _ := os.ReadDir("/proc")
	var out []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' {
			continue
		}
		fields := strings.Fields(string(stat[i+2:]))
		if len(fields) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		out = append(out, proc{pid: pid, ppid: ppid})
	}
	return out
}

// descendants are the pids of root's live descendants, root left out.
func descendants(root int) []proc {
	all := readProcs()
	children := map[int][]proc{}
	for _, p := range all {
		children[p.ppid] = append(children[p.ppid], p)
	}
	var out []proc
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			out = append(out, c)
			queue = append(queue, c.pid)
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
	env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		return false
	}
	want := []byte(kv)
	for _, e := range bytes.Split(env, []byte{0}) {
		if bytes.Equal(e, want) {
			return true
		}
	}
	return false
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
		tagged[p.pid] = environHas(p.pid, kv)
		if tagged[p.pid] && !tagged[p.ppid] {
			out = append(out, p.pid)
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
		_ = syscall.Kill(d.pid, sig)
	}
}

// killMarked SIGKILLs every live process whose environment carries markerEnv=marker and
// returns how many there were.
func killMarked(marker string) int {
	kv := markerEnv + "=" + marker
	self := os.Getpid()
	n := 0
	for _, p := range readProcs() {
		if p.pid != self && environHas(p.pid, kv) {
			_ = syscall.Kill(p.pid, syscall.SIGCONT)
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
			n++
		}
	}
	return n
}
