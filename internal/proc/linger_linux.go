package proc

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/proc/procfs"
)

// cldExited is si_code CLD_EXITED: the child called exit.
const cldExited = 1

// lingerPoll is how often lingerGroup looks whether the group is empty.
const lingerPoll = 20 * time.Millisecond

// sigchldInfo is the layout of a siginfo_t for SIGCHLD on Linux, which
// unix.Siginfo leaves opaque past its first 16 bytes.
type sigchldInfo struct {
	Signo  int32
	Errno  int32
	Code   int32
	_      int32
	Pid    int32
	UID    uint32
	Status int32
	_      [100]byte
}

// exitedZero says whether info (from waitid) is a process that exited
// with status 0.
func exitedZero(info *unix.Siginfo) bool {
	ci := (*sigchldInfo)(unsafe.Pointer(info))
	return ci.Code == cldExited && ci.Status == 0
}

// lingerGroup waits until no live process but the (ended, unreaped)
// leader is left in process group pgid, or until d has passed. The
// leader stays a zombie meanwhile, so the group ID cannot be reused.
func lingerGroup(pgid int, d time.Duration) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(lingerPoll)
	defer tick.Stop()
	for groupHasOthers(pgid) {
		select {
		case <-deadline.C:
			return
		case <-tick.C:
		}
	}
}

// groupHasOthers says whether a live process other than pgid itself is in
// process group pgid, from /proc. If /proc cannot be read it says false:
// the group is then killed at once, as without a linger.
func groupHasOthers(pgid int) bool {
	pids, err := procfs.PIDs()
	if err != nil {
		return false
	}
	for _, pid := range pids {
		if pid == pgid {
			continue
		}
		// getpgid is one system call; reading /proc/PID/stat takes
		// several and the kernel formats all of its fields. Reading
		// every process's was a third of the CPU time of a launch of 4
		// no-op workers: read only the group's members'.
		if group, err := unix.Getpgid(pid); err != nil || group != pgid {
			continue
		}
		if p, err := procfs.Stat(pid); err == nil && p.PGRP == pgid && !p.Zombie() {
			return true
		}
	}
	return false
}
