package proc

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/proc/procfs"
)

// Guard is a helper process that kills, with SIGKILL, every process group
// it was told about and not told to forget, once gorun is gone for any
// reason (SIGKILL, a crash, a bug) — the parent-death signal reaches only
// each group's leader, so without a guard a worker's own children would
// outlive a SIGKILLed gorun. gorun talks to it over a pipe whose end of
// file is the guard's signal: the kernel closes gorun's end when gorun
// dies. A Guard's methods are safe for concurrent use; errors talking to
// the guard are remembered (Err) but never stop a worker from starting.
//
// A group is watched once gorun has forked its leader and told the guard,
// and gorun can die in between: then the leader dies of its parent-death
// signal, but what it started already would live on. So every process a
// Guard's Spec starts also carries the guard's mark in its environment
// (GuardMarkEnv=<random token>, inherited by its descendants), and the
// guard, once gorun is gone, also kills every process that carries it.
type Guard struct {
	cmd     *exec.Cmd
	mark    string
	mu      sync.Mutex
	w       *os.File
	err     error
	watched map[int]bool // the groups told with Watch and not yet with Forget
}

// A Guard can also be given directories to remove once gorun is gone
// (RemoveAtExit): the files gorun keeps for its job's life (its workers'
// snapshots on a tmpfs) go with it whichever way it ends.

// GuardMarkEnv is the environment variable that marks the processes a
// Guard watches: their descendants inherit it unless they clear their
// environment.
const GuardMarkEnv = "GORUN_GUARD_MARK"

// StartGuard starts argv as the guard: a program that calls RunGuard on
// its standard input (gorun re-executes itself with a hidden command). The
// guard runs in its own process group, so a Ctrl-C meant for the job does
// not reach it.
func StartGuard(argv []string) (*Guard, error) {
	if len(argv) == 0 {
		return nil, errors.New("proc: guard: empty command")
	}
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return nil, fmt.Errorf("proc: guard: %w", err)
	}
	mark := hex.EncodeToString(token)
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
	g := &Guard{cmd: cmd, mark: mark, w: w, watched: map[int]bool{}}
	g.sendLine("=" + mark)
	return g, nil
}

// markEnv returns the environment entry that marks a watched process;
// "" for a nil Guard.
func (g *Guard) markEnv() string {
	if g == nil {
		return ""
	}
	return GuardMarkEnv + "=" + g.mark
}

func (g *Guard) send(op byte, pgid int) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if op == '+' {
		g.watched[pgid] = true
	} else {
		delete(g.watched, pgid)
	}
	g.writeLocked(string(op) + strconv.Itoa(pgid))
}

func (g *Guard) sendLine(line string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.writeLocked(line)
}

// writeLocked writes line to the guard; g.mu is held.
func (g *Guard) writeLocked(line string) {
	if g.w == nil || g.err != nil {
		return
	}
	if _, err := g.w.Write([]byte(line + "\n")); err != nil {
		g.err = fmt.Errorf("proc: guard: %w", err)
	}
}

// Watch tells the guard to kill group pgid if gorun dies. A nil Guard does
// nothing.
func (g *Guard) Watch(pgid int) { g.send('+', pgid) }

// Forget tells the guard that group pgid is gone. A nil Guard does nothing.
func (g *Guard) Forget(pgid int) { g.send('-', pgid) }

// RemoveAtExit tells the guard to remove dir, and everything under it,
// once gorun is gone (after it killed the watched groups). dir must be an
// absolute, clean path other than "/" on one line: anything else is
// refused with an error and the guard is told nothing. A nil Guard does
// nothing. Close does not remove dir: whoever made it removes it too.
func (g *Guard) RemoveAtExit(dir string) error {
	if err := checkRemovable(dir); err != nil {
		return err
	}
	if g == nil {
		return nil
	}
	g.sendLine("d" + dir)
	return nil
}

// checkRemovable refuses a directory the guard must not remove: a
// relative or unclean path, "/", or one with a line break (the guard's
// protocol is lines).
func checkRemovable(dir string) error {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir || dir == "/" || strings.ContainsAny(dir, "\n\x00") {
		return fmt.Errorf("proc: guard: %q is not a directory it may remove: want an absolute, clean path other than /", dir)
	}
	return nil
}

// Err is the first error talking to the guard, if any.
func (g *Guard) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Close ends the guard and waits for it to exit. With groups still
// watched, the guard kills them, and every process carrying its mark, as
// if gorun had died. With none (every process started was reaped and its
// group killed), there is nothing left for it to do: Close kills it with
// SIGKILL rather than wait for it to read the end of its input, which a
// guard still starting up (a whole gorun binary's start, the longest part
// of a short job's launch) would read only once started, and to scan
// /proc. Descendants that left their group then live on, as Process says.
func (g *Guard) Close() error {
	g.mu.Lock()
	w := g.w
	g.w = nil
	idle := len(g.watched) == 0 && g.err == nil
	g.mu.Unlock()
	if w == nil {
		return nil
	}
	if idle {
		// The guard leads a group of its own (StartGuard): this kills
		// whatever it may have started too.
		_ = unix.Kill(-g.cmd.Process.Pid, unix.SIGKILL)
		err := g.cmd.Wait()
		if ps := g.cmd.ProcessState; ps != nil {
			if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
				err = nil
			}
		}
		return errors.Join(w.Close(), err)
	}
	return errors.Join(w.Close(), g.cmd.Wait(), g.Err())
}

// RunGuard is the guard's body: it reads "=MARK", "+PGID", "-PGID" and
// "dDIR" lines from r until end of file, then SIGKILLs every group still
// watched, and every process (and its group) whose environment carries
// GuardMarkEnv=MARK, until a scan of /proc finds none, and last removes
// every DIR (RemoveAtExit). It ignores the signals that stop a job, which
// are gorun's to handle; it returns an error for a malformed line (and
// ignores that line) or a directory it could not remove.
func RunGuard(r io.Reader) error {
	signalIgnore()
	watched := map[int]bool{}
	mark := ""
	var dirs []string
	sc := bufio.NewScanner(r)
	var bad []error
	for sc.Scan() {
		line := sc.Text()
		if m, ok := strings.CutPrefix(line, "="); ok && m != "" {
			mark = m
			continue
		}
		if dir, ok := strings.CutPrefix(line, "d"); ok {
			if err := checkRemovable(dir); err != nil {
				bad = append(bad, fmt.Errorf("proc: guard: bad line %q: %w", line, err))
				continue
			}
			dirs = append(dirs, dir)
			continue
		}
		pgid, err := strconv.Atoi(line[min(1, len(line)):])
		if err != nil || pgid <= 0 || (line[0] != '+' && line[0] != '-') {
			bad = append(bad, fmt.Errorf("proc: guard: bad line %q", line))
			continue
		}
		watched[pgid] = line[0] == '+'
	}
	for pgid, live := range watched {
		if live {
			_ = unix.Kill(-pgid, unix.SIGKILL)
		}
	}
	if mark != "" {
		killMarked(GuardMarkEnv + "=" + mark)
	}
	for _, dir := range dirs {
		if err := os.RemoveAll(dir); err != nil {
			bad = append(bad, fmt.Errorf("proc: guard: %w", err))
		}
	}
	return errors.Join(bad...)
}

// maxMarkScans bounds killMarked's scans of /proc: each kills what the
// one before missed (processes forked meanwhile), and marked processes
// cannot fork once killed.
const maxMarkScans = 10

// killMarked SIGKILLs every process whose environment holds the entry
// mark, and its process group, scanning /proc until a scan finds none.
func killMarked(mark string) {
	for range maxMarkScans {
		found := false
		marked, _ := procfs.Scan(mark)
		for _, p := range marked {
			if pgid, err := unix.Getpgid(p.PID); err == nil && pgid > 1 {
				_ = unix.Kill(-pgid, unix.SIGKILL)
			}
			if unix.Kill(p.PID, unix.SIGKILL) == nil {
				found = true
			}
		}
		if !found {
			return
		}
	}
}

// signalIgnore makes the guard deaf to the signals that stop a job: it
// must outlive gorun to be of use.
func signalIgnore() {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
}
