package proc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Guard is a helper process that kills, with SIGKILL, every process group
// it was told about and not told to forget, once gorun is gone for any
// reason (SIGKILL, a crash, a bug) — the parent-death signal reaches only
// each group's leader, so without a guard a worker's own children would
// outlive a SIGKILLed gorun. gorun talks to it over a pipe whose end of
// file is the guard's signal: the kernel closes gorun's end when gorun
// dies. A Guard's methods are safe for concurrent use; errors talking to
// the guard are remembered (Err) but never stop a worker from starting.
type Guard struct {
	cmd *exec.Cmd
	mu  sync.Mutex
	w   *os.File
	err error
}

// StartGuard starts argv as the guard: a program that calls RunGuard on
// its standard input (gorun re-executes itself with a hidden command). The
// guard runs in its own process group, so a Ctrl-C meant for the job does
// not reach it.
func StartGuard(argv []string) (*Guard, error) {
	if len(argv) == 0 {
		return nil, errors.New("proc: guard: empty command")
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("proc: guard: %w", err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin = r
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("proc: start guard %s: %w", argv[0], err)
	}
	r.Close()
	return &Guard{cmd: cmd, w: w}, nil
}

func (g *Guard) send(op byte, pgid int) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.w == nil || g.err != nil {
		return
	}
	if _, err := g.w.Write([]byte(string(op) + strconv.Itoa(pgid) + "\n")); err != nil {
		g.err = fmt.Errorf("proc: guard: %w", err)
	}
}

// Watch tells the guard to kill group pgid if gorun dies. A nil Guard does
// nothing.
func (g *Guard) Watch(pgid int) { g.send('+', pgid) }

// Forget tells the guard that group pgid is gone. A nil Guard does nothing.
func (g *Guard) Forget(pgid int) { g.send('-', pgid) }

// Err is the first error talking to the guard, if any.
func (g *Guard) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Close ends the guard: it kills the groups still watched (none, when every
// worker was reaped) and exits; Close waits for it.
func (g *Guard) Close() error {
	g.mu.Lock()
	w := g.w
	g.w = nil
	g.mu.Unlock()
	if w == nil {
		return nil
	}
	return errors.Join(w.Close(), g.cmd.Wait(), g.Err())
}

// RunGuard is the guard's body: it reads "+PGID" and "-PGID" lines from r
// until end of file, then SIGKILLs every group still watched. It ignores
// the signals that stop a job, which are gorun's to handle; it returns an
// error only for a malformed line.
func RunGuard(r io.Reader) error {
	signalIgnore()
	watched := map[int]bool{}
	sc := bufio.NewScanner(r)
	var bad error
	for sc.Scan() {
		line := sc.Text()
		pgid, err := strconv.Atoi(line[min(1, len(line)):])
		if err != nil || pgid <= 0 || (line[0] != '+' && line[0] != '-') {
			bad = fmt.Errorf("proc: guard: bad line %q", line)
			continue
		}
		watched[pgid] = line[0] == '+'
	}
	for pgid, live := range watched {
		if live {
			_ = unix.Kill(-pgid, unix.SIGKILL)
		}
	}
	return bad
}

// signalIgnore makes the guard deaf to the signals that stop a job: it
// must outlive gorun to be of use.
func signalIgnore() {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
}
