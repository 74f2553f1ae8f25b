package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// Variables that mark the processes of a bench run (workers inherit
// them), by which sweep finds leftovers: markerEnv is set by
// bench/rendezvous.sh for the whole run (the etcd server too), partEnv by
// one command of this program for the processes it starts.
const (
	markerEnv = "RDZVBENCH_MARKER"
	partEnv   = "RDZVBENCH_PART"
)

// errTimedOut says a process did not exit in the time it was given.
var errTimedOut = errors.New("did not exit")

// proc is one process this bench started, in its own process group.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string // stdout and stderr
	done chan struct{}
	err  error // Wait's, once done is closed
	end  time.Time
}

// startProc starts argv with env added to ours, output to logPath, in a
// new process group that gets SIGKILL if this process dies.
func startProc(name string, env []string, logPath string, argv ...string) (*proc, error) {
	out, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		p.end = time.Now()
		out.Close()
		close(p.done)
	}()
	return p, nil
}

// exitCode is the process's exit status once done: -1 when killed by a
// signal.
func (p *proc) exitCode() int { return p.cmd.ProcessState.ExitCode() }

// wait waits up to within for the process to exit; then it kills its
// group and fails.
func (p *proc) wait(ctx context.Context, within time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(within):
		p.kill()
		return fmt.Errorf("%s: %w within %s (killed)", p.name, errTimedOut, within)
	case <-ctx.Done():
		p.kill()
		return ctx.Err()
	}
}

// stop sends SIGTERM to the process, waits up to grace, then SIGKILLs
// its process group; it also kills whatever is left in the group.
func (p *proc) stop(grace time.Duration) {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
		}
	}
	p.kill()
}

// kill SIGKILLs the process group and waits for the process.
func (p *proc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// tail returns the last bytes of the process's log.
func (p *proc) tail() string {
	data, _ := os.ReadFile(p.log)
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return string(data)
}

// sweep SIGKILLs every process but this one whose environment has
// name=value and returns how many it found.
func sweep(name, value string) int {
	want := []byte("\x00" + name + "=" + value + "\x00")
	pids, _ := filepath.Glob("/proc/[0-9]*")
	n := 0
	for _, dir := range pids {
		pid, err := strconv.Atoi(filepath.Base(dir))
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join(dir, "environ"))
		if err != nil || !bytes.Contains(append(append([]byte{0}, env...), 0), want) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

func sweepCmd(_ context.Context, args []string) error {
	fs := newFlags("sweep")
	marker := fs.String("marker", "", "the value of "+markerEnv+" to look for")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *marker == "" {
		return errors.New("-marker is required")
	}
	if n := sweep(markerEnv, *marker); n > 0 {
		fmt.Fprintf(os.Stderr, "rdzvbench sweep: killed %d leftover process(es)\n", n)
	}
	return nil
}
