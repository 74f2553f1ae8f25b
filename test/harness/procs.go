package harness

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gorun/gorun/internal/proc/procfs"
)

// Proc is one live process a run started, as /proc shows it.
type Proc struct {
	procfs.Process
	Env  []string // its environment, "KEY=VALUE" each
	Args []string // its command line
}

// Getenv is the value of key in p's environment, and whether it is set.
func (p Proc) Getenv(key string) (string, bool) {
	for _, kv := range p.Env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v, true
		}
	}
	return "", false
}

// String is "PID command line", for a test's message.
func (p Proc) String() string {
	return fmt.Sprintf("%d %s", p.PID, strings.Join(p.Args, " "))
}

// Marked lists, by pid, the live processes (the caller left out) whose environment holds
// entry ("KEY=VALUE"): a marker set in one started process's environment, which its
// descendants inherit (procfs.Scan). A process that ends while it is read is left out.
func Marked(entry string) []Proc {
	found, _ := procfs.Scan(entry)
	var out []Proc
	for _, p := range found {
		env, err1 := procfs.Environ(p.PID)
		args, err2 := procfs.Cmdline(p.PID)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, Proc{Process: p, Env: env, Args: args})
	}
	slices.SortFunc(out, func(a, b Proc) int { return a.PID - b.PID })
	return out
}

// Stopped says whether no thread of process pid can run: each is stopped or traced (state T or
// t), or the process is a zombie or gone. kill(SIGSTOP) only queues the signal; this is when
// it has taken effect.
func Stopped(pid int) bool {
	threads, _ := procfs.Threads(pid)
	for _, t := range threads {
		switch t.State {
		case 'T', 't', 'Z', 'X':
		default:
			return false
		}
	}
	return true
}
