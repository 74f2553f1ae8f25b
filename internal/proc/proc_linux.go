package proc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// outputWaitDelay bounds how long reaping waits for the output pipes to reach EOF once the process
// group is gone. Only a descendant that left the group (setsid) can still hold them open; after
// this delay the pipes are closed and whatever it writes later is lost.
const outputWaitDelay = 2 * time.Second

// Spec describes one process to start.
type Spec struct {
	// Path is the executable. A path without a slash is looked up with exec.LookPath in gorun's own
	// PATH (not in Env); a relative path with a slash is relative to Dir.
	Path string
	// Args are the arguments after argv[0], which is Path.
	Args []string
	// Env is the full environment, KEY=VALUE. Nil inherits gorun's environment; an empty non-nil
	// slice gives an empty one.
	Env []string
	// Dir is the working directory; empty means gorun's.
	Dir string
	// Stdout and Stderr receive the output; nil discards it (the process gets /dev/null). An
	// *os.File is handed to the process directly; any other writer is fed from a pipe by a
	// goroutine, and Done waits until that goroutine has drained the pipe, so such a writer must
	// not block for long. Only a descendant that escaped the group (setsid) can keep the pipe open
	// after the process ends; reaping then waits 2 s for it before closing the pipe.
	Stdout io.Writer
	Stderr io.Writer
	// ExtraFiles are open files the process inherits as descriptors 3, 4,
	// ... (exec.Cmd.ExtraFiles).
	ExtraFiles []*os.File
	// Guard, when not nil, watches the process group from its start until
	// the leader has ended and the group was killed, so that the group
	// dies even if gorun is killed with SIGKILL; the process's environment
	// gets the guard's mark (GuardMarkEnv), so that it and its descendants
	// die too when gorun is killed before it told the guard of the group.
	Guard *Guard
	// Stdin is the process's standard input, shared with whoever else
	// holds it (torchrun's workers inherit the agent's, so that pdb works);
	// nil gives /dev/null. The process runs in a session of its own, so
	// reading a terminal does not stop it (SIGTTIN) as it would a
	// background process group.
	Stdin *os.File
	// Linger is how long the rest of the process group may run on its own
	// after the leader exited with status 0 (a successful worker's
	// background children, such as uploaders): the group is killed with
	// SIGKILL once it is empty of other processes, or Linger later,
	// whichever is first. Meanwhile the process is not Done, and Signal and
	// Stop reach the whole group. 0 kills the group as soon as the leader
	// ends, as after a failure.
	Linger time.Duration
	// CPUs, when not empty, is the CPU affinity the process starts with
	// (sched_setaffinity); the CPUs must be ones gorun may use. Empty
	// inherits gorun's.
	CPUs []int
}

// Process is a started process, the leader of its own process group. Its methods are safe for
// concurrent use.
//
// Every member of the group is killed with SIGKILL as soon as the leader ends (after Spec.Linger,
// for a leader that exited with status 0), and before the leader is reaped, so that no process of a worker outlives it and the group ID is
// never reused while it may still be signalled. Descendants that leave the group (setsid, setpgid)
// escape this, and so does the rest of the group if gorun itself is killed with SIGKILL: only the
// leader gets the parent-death signal.
type Process struct {
	pid     int
	started time.Time
	done    chan struct{}

	mu     sync.Mutex // held while signalling, so that the group is never signalled once exited is set
	exited bool       // the leader has ended; from then on the group must not be signalled

	result Result // written once before done is closed
}

// Start starts spec as the leader of a new process group, with SIGKILL as its parent-death signal.
//
// The process is started, and later waited for and reaped, by one goroutine that holds
// runtime.LockOSThread: the parent-death signal fires when the thread that forked exits, so that
// thread must live until the process is reaped. Start returns once the process has started. On
// error (no such executable, bad Dir, ...) nothing is left running and the error is wrapped with
// the path.
func Start(spec Spec) (*Process, error) {
	if spec.Path == "" {
		return nil, errors.New("proc: start: empty path")
	}
	cmd := exec.Command(spec.Path, spec.Args...)
	cmd.Env = spec.Env
	if mark := spec.Guard.markEnv(); mark != "" {
		if cmd.Env == nil {
			cmd.Env = os.Environ()
		}
		cmd.Env = append(slices.Clip(cmd.Env), mark)
	}
	cmd.Dir = spec.Dir
	cmd.ExtraFiles = spec.ExtraFiles
	// Assign only non-nil writers: a nil *os.File in an io.Writer would not count as nil.
	if spec.Stdout != nil {
		cmd.Stdout = spec.Stdout
	}
	if spec.Stderr != nil {
		cmd.Stderr = spec.Stderr
	}
	if spec.Stdin != nil {
		cmd.Stdin = spec.Stdin
	}
	if spec.Linger < 0 {
		return nil, fmt.Errorf("proc: start %s: negative linger %s", spec.Path, spec.Linger)
	}
	// A new session is also a new process group, whose ID is the PID.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = outputWaitDelay

	p := &Process{done: make(chan struct{})}
	started := make(chan error, 1)
	go p.run(cmd, spec, started)
	if err := <-started; err != nil {
		return nil, fmt.Errorf("proc: start %s: %w", spec.Path, err)
	}
	return p, nil
}

// run starts cmd, reports the start on started, then waits for the process, kills what is left of
// its group and reaps it, all on one locked OS thread.
func (p *Process) run(cmd *exec.Cmd, spec Spec, started chan<- error) {
	runtime.LockOSThread()
	dirty, err := startWithCPUs(cmd, spec.CPUs)
	if !dirty {
		// Else the goroutine ends locked, and its thread with it.
		defer runtime.UnlockOSThread()
	}
	guard := spec.Guard
	if err != nil {
		started <- err
		return
	}
	p.pid = cmd.Process.Pid
	p.started = time.Now()
	guard.Watch(p.pid)
	started <- nil

	// Wait for the leader to end without reaping it: while it is a zombie its PID, which is also
	// the group ID, cannot be reused, so killing the group cannot hit a stranger.
	var info unix.Siginfo
	waitErr := waitExited(p.pid, &info)
	ended := time.Now()
	if waitErr == nil && spec.Linger > 0 && exitedZero(&info) {
		lingerGroup(p.pid, spec.Linger)
	}
	p.mu.Lock()
	p.exited = true
	if waitErr == nil {
		// ESRCH means the group is already empty; nothing else can fail for our own child.
		_ = unix.Kill(-p.pid, unix.SIGKILL)
	}
	p.mu.Unlock()
	guard.Forget(p.pid)

	err = cmd.Wait()
	r := Result{PID: p.pid, Started: p.started, Ended: ended, ExitCode: -1}
	if ps := cmd.ProcessState; ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok {
			resultFromStatus(&r, ws)
		}
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		r.Err = fmt.Errorf("proc: wait for %d: %w", p.pid, err)
	} else if waitErr != nil {
		r.Err = fmt.Errorf("proc: wait for %d: %w", p.pid, waitErr)
	}
	p.result = r
	close(p.done)
}

// waitExited blocks until process pid has ended, leaving it unreaped; info tells how.
func waitExited(pid int, info *unix.Siginfo) error {
	for {
		err := unix.Waitid(unix.P_PID, pid, info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// PID returns the process ID, which is also its process group ID.
func (p *Process) PID() int {
	return p.pid
}

// Done returns a channel that is closed once the process has been reaped, the rest of its group
// killed, and its output drained.
func (p *Process) Done() <-chan struct{} {
	return p.done
}

// Result returns how the process ended. Before Done is closed it returns only PID and Started,
// with ExitCode -1.
func (p *Process) Result() Result {
	select {
	case <-p.done:
		return p.result
	default:
		return Result{PID: p.pid, Started: p.started, ExitCode: -1}
	}
}

// Wait blocks until Done is closed and returns the Result.
func (p *Process) Wait() Result {
	<-p.done
	return p.result
}

// Signal sends sig to the whole process group. It returns os.ErrProcessDone once the leader has
// ended (the group has then been killed already), or the kill(2) error wrapped with the group.
func (p *Process) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return os.ErrProcessDone
	}
	if err := unix.Kill(-p.pid, sig); err != nil {
		return fmt.Errorf("proc: send %s to process group %d: %w", unix.SignalName(sig), p.pid, err)
	}
	return nil
}

// Stop sends sig to the process group, waits up to grace for the leader to end, then sends SIGKILL
// to the group, and returns the Result once the process is reaped. With sig 0 or SIGKILL, or a grace
// <= 0, it sends SIGKILL at once. It cannot fail: if sending sig fails, the SIGKILL after grace
// still follows. Once the SIGKILL is sent it waits as long as the kernel takes to end the process
// (a process in uninterruptible sleep delays it). Stopping a process that has ended already just
// returns its Result.
func (p *Process) Stop(sig syscall.Signal, grace time.Duration) Result {
	if sig != 0 && sig != syscall.SIGKILL && grace > 0 {
		_ = p.Signal(sig)
		timer := time.NewTimer(grace)
		defer timer.Stop()
		select {
		case <-p.done:
			return p.result
		case <-timer.C:
		}
	}
	_ = p.Signal(syscall.SIGKILL)
	return p.Wait()
}

// StopAll stops every process of ps at once: it sends each group sig, waits until all have ended,
// grace has passed or hurry is closed (a nil hurry never is), then sends SIGKILL to the groups still
// running, and returns once every process is reaped, saying whether it had to send SIGKILL. Nil
// entries are skipped; each Result is then available from Result. With sig 0 or SIGKILL, or a grace
// <= 0, it sends SIGKILL at once.
func StopAll(ps []*Process, sig syscall.Signal, grace time.Duration, hurry <-chan struct{}) (killed bool) {
	ps = slices.DeleteFunc(slices.Clone(ps), func(p *Process) bool { return p == nil })
	allDone := make(chan struct{})
	go func() {
		for _, p := range ps {
			<-p.done
		}
		close(allDone)
	}()
	if sig != 0 && sig != syscall.SIGKILL && grace > 0 {
		for _, p := range ps {
			_ = p.Signal(sig)
		}
		timer := time.NewTimer(grace)
		defer timer.Stop()
		select {
		case <-allDone:
			return false
		case <-timer.C:
		case <-hurry:
		}
	}
	for _, p := range ps {
		if p.Signal(syscall.SIGKILL) == nil {
			killed = true
		}
	}
	<-allDone
	return killed
}
