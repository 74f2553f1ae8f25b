package procfs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
)

// root is where the kernel mounts the process file system.
const root = "/proc"

// pfExiting is the kernel's PF_EXITING task flag: the process is in exit. It is set before
// the process's files are closed.
const pfExiting = 0x4

// Process is what /proc/PID/stat says of one process, the fields gorun reads.
type Process struct {
	PID   int
	Comm  string // the command name (/proc/PID/comm): 15 bytes at most, what prctl(PR_SET_NAME) set
	State byte   // one letter: R running, S sleeping, D disk sleep, T stopped, t traced, Z zombie, X dead, ...
	PPID  int
	PGRP  int
	Flags uint64 // the kernel's PF_* task flags
}

// Zombie says whether the process has ended (Z or X): it holds nothing but its pid.
func (p Process) Zombie() bool { return p.State == 'Z' || p.State == 'X' }

// Exiting says whether the kernel has begun the process's exit (PF_EXITING). The flag is set
// before the process's files are closed, so a peer that saw its connections break finds the
// process exiting already.
func (p Process) Exiting() bool { return p.Flags&pfExiting != 0 }

// Stat reads /proc/PID/stat. The error wraps os.ErrNotExist when there is no such process.
func Stat(pid int) (Process, error) {
	data, err := os.ReadFile(path(pid, "stat"))
	if err != nil {
		return Process{}, fmt.Errorf("procfs: %w", err)
	}
	return parseStat(pid, data)
}

// parseStat parses the content of /proc/PID/stat.
func parseStat(pid int, data []byte) (Process, error) {
	// The command name is in parentheses and may hold anything, ')' and spaces included: the
	// fields after its last ')' are state, ppid, pgrp, session, tty_nr, tpgid, flags, ...
	i := bytes.LastIndexByte(data, ')') // the name is between the first '(' and the last ')'

	if i < 0 {
		return Process{}, fmt.Errorf("procfs: /proc/%d/stat: no ')' after the command name in %q", pid, data)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 7 || len(f[0]) != 1 {
		return Process{}, fmt.Errorf("procfs: /proc/%d/stat: want state, ppid, pgrp, session, tty_nr, tpgid and flags after the command name, got %q", pid, data[i+1:])
	}
	p := Process{PID: pid, State: f[0][0]}
	if j := bytes.IndexByte(data, '('); j >= 0 && j < i {
		p.Comm = string(data[j+1 : i])
	}
	var errs [3]error
	p.PPID, errs[0] = strconv.Atoi(f[1])
	p.PGRP, errs[1] = strconv.Atoi(f[2])
	p.Flags, errs[2] = strconv.ParseUint(f[6], 10, 64)
	for _, err := range errs {
		if err != nil {
			return Process{}, fmt.Errorf("procfs: /proc/%d/stat: %w", pid, err)
		}
	}
	return p, nil
}

// Threads reads the stat line of each thread of process pid (/proc/PID/task/TID/stat; the
// Process's PID is the thread's id). A thread that ends while they are read is left out; a
// process gone has none, and no error.
func Threads(pid int) ([]Process, error) {
	names, err := os.ReadDir(path(pid, "task"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("procfs: %w", err)
	}
	var out []Process
	for _, e := range names {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(path(pid, "task/"+e.Name()+"/stat"))
		if err != nil {
			continue // that thread ended
		}
		t, err := parseStat(tid, data)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// Environ reads the environment process pid started with (/proc/PID/environ), one
// "KEY=VALUE" entry each. It is an error for a zombie (its memory is gone) and for another
// user's process (wrapping os.ErrPermission).
func Environ(pid int) ([]string, error) {
	return nulSeparated(pid, "environ")
}

// Cmdline reads process pid's arguments (/proc/PID/cmdline); a zombie has none.
func Cmdline(pid int) ([]string, error) {
	return nulSeparated(pid, "cmdline")
}

func nulSeparated(pid int, file string) ([]string, error) {
	data, err := os.ReadFile(path(pid, file))
	if err != nil {
		return nil, fmt.Errorf("procfs: %w", err)
	}
	data = bytes.TrimSuffix(data, []byte{0})
	if len(data) == 0 {
		return nil, nil
	}
	return strings.Split(string(data), "\x00"), nil
}

// Namespace is the identity of process pid's namespace of kind ("uts", "net", "pid", ...), as
// the link /proc/PID/ns/KIND names it ("uts:[4026531838]"): two processes share the
// namespace when their identities are equal.
func Namespace(pid int, kind string) (string, error) {
	ns, err := os.Readlink(path(pid, "ns/"+kind))
	if err != nil {
		return "", fmt.Errorf("procfs: %w", err)
	}
	return ns, nil
}

// PIDs lists the pid of every process /proc shows, in the kernel's order.
func PIDs() ([]int, error) {
	dir, err := os.Open(root)
	if err != nil {
		return nil, fmt.Errorf("procfs: %w", err)
	}
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("procfs: %w", err)
	}
	pids := make([]int, 0, len(names))
	for _, name := range names {
		if pid, err := strconv.Atoi(name); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// Scan lists the live processes, the caller left out, whose environment holds entry
// ("KEY=VALUE") exactly: a marker set in one process's environment finds it and every
// descendant that inherited it. Zombies are left out (they hold nothing), and so are
// processes whose environment cannot be read (another user's, or ended meanwhile). Its
// error is only for /proc itself unreadable.
func Scan(entry string) ([]Process, error) {
	pids, err := PIDs()
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	var out []Process
	for _, pid := range pids {
		if pid == self {
			continue
		}
		if env, err := Environ(pid); err != nil || !slices.Contains(env, entry) {
			continue
		}
		if p, err := Stat(pid); err == nil && !p.Zombie() {
			out = append(out, p)
		}
	}
	return out, nil
}

func path(pid int, file string) string {
	return root + "/" + strconv.Itoa(pid) + "/" + file
}
