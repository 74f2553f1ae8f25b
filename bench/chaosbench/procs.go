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
type proc struct {
	pid, ppid int
	cmdline   string
}

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
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out = append(out, proc{pid: pid, ppid: ppid, cmdline: strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))})
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

// workersOf are the embedded trainer's worker processes under agent pid.
func workersOf(pid int) []int {
	var out []int
	for _, p := range descendants(pid) {
		if strings.Contains(p.cmdline, " worker ") {
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
	want := []byte(markerEnv + "=" + marker)
	self := os.Getpid()
	n := 0
	for _, p := range readProcs() {
		if p.pid == self {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.pid), "environ"))
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(env, []byte{0}) {
			if bytes.Equal(kv, want) {
				_ = syscall.Kill(p.pid, syscall.SIGCONT)
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
				n++
				break
			}
		}
	}
	return n
}
