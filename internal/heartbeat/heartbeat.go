// Package heartbeat is the channel between a worker and its agent: one
// Unix socket pair whose worker end is the worker's descriptor 3. The
// worker reports progress on it (so the agent can tell a hung worker from
// a slow one without polling) and says when it awaits a new round; the
// agent sends it its contract in the next round, so a worker can be kept
// across rounds (in-place recovery).
package heartbeat

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/broadcast"
	"github.com/gorun/gorun/internal/distenv"
)

// EnvVar names the file descriptor of a worker's end of the channel. The
// agent sets it; a worker that never writes is never judged hung.
const EnvVar = "GORUN_HEARTBEAT_FD"

// StandbyEnvVar, set to 1 in a worker's environment, makes it a hot
// spare: its contract variables describe no round yet, so it builds its
// trainer, says it is ready (Beater.Ready) and awaits its first round's
// contract on the channel instead of training.
const StandbyEnvVar = "GORUN_STANDBY"

// WorkerFD is the descriptor the worker end has in the worker: the first
// of exec.Cmd.ExtraFiles.
const WorkerFD = 3

// sendTimeout bounds SendRound: a worker that never reads its channel
// must not block the agent once the socket's buffer is full.
const sendTimeout = 5 * time.Second

// Pipe is one worker's channel, agent side. It lives as long as the
// worker, across rounds: Watch follows it for one round, Close ends it.
type Pipe struct {
	agent  *os.File // the agent's end: progress in, rounds out
	worker *os.File // the worker's end, until CloseWorkerEnd

	start sync.Once
	done  chan struct{} // closed when the worker's end is closed everywhere, or at Close

	// readMu is held while bytes are read from the agent's end and their
	// lines handled (by read or Drain), so that once Drain holds it,
	// every line the worker wrote before Drain began has been handled.
	readMu  sync.Mutex
	partial []byte // the start of a line not yet ended, under readMu

	mu       sync.Mutex
	lastStep int
	lastBeat time.Time
	beats    int64         // progress lines read
	awaiting *Await        // the worker awaits a round: set by an await line, cleared by progress
	ready    chan struct{} // closed by a ready line
	isReady  bool
	requeued bool             // the worker said it stops to be requeued
	wake     broadcast.Signal // notified at each line read
	onBeat   func(Progress)
	onAwait  func(Await)
	onSilent func(peer int)

	sendMu    sync.Mutex
	closeOnce sync.Once
}

// NewPipe makes the channel; give WorkerEnd to the worker as its first
// extra file and close it here once the worker started (CloseWorkerEnd).
// Neither end leaks into other processes the agent starts (close on
// exec), except the worker end where it is given.
func NewPipe() (*Pipe, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("heartbeat: socket pair: %w", err)
	}
	// The agent's end is non-blocking, so that Go's poller serves it and
	// reads and writes take deadlines; the worker's stays blocking, as a
	// plain program (a shell, a PyTorch script) expects.
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, fmt.Errorf("heartbeat: socket pair: %w", err)
	}
	return &Pipe{
		agent: os.NewFile(uintptr(fds[0]), "heartbeat-agent"), worker: os.NewFile(uintptr(fds[1]), "heartbeat"),
		lastStep: -1, done: make(chan struct{}), ready: make(chan struct{}),
	}, nil
}

// WorkerEnd is the worker's end, to give to the worker.
func (p *Pipe) WorkerEnd() *os.File { return p.worker }

// CloseWorkerEnd closes the agent's copy of the worker's end, so the
// agent's end sees end of file when the worker (and its children) are
// gone.
func (p *Pipe) CloseWorkerEnd() error { return p.worker.Close() }

// Close ends the channel on the agent's side: Watch returns, SendRound
// fails, and the worker reads end of file. It is safe to call more than
// once.
func (p *Pipe) Close() error {
	var err error
	p.closeOnce.Do(func() { err = p.agent.Close() })
	return err
}

// Stall says a worker made no progress for too long.
type Stall struct {
	LastStep int           // the last step it reported
	Silent   time.Duration // since its last heartbeat
}

func (s Stall) String() string {
	return fmt.Sprintf("no progress for %s after step %d (heartbeat timeout)", s.Silent.Round(time.Millisecond), s.LastStep)
}

// OnBeat makes the pipe call f with every heartbeat's progress, from its
// reading goroutine, as it arrives: f must not block. Call it before the
// first Watch.
func (p *Pipe) OnBeat(f func(Progress)) { p.onBeat = f }

// OnAwait makes the pipe call f with every await line, from its reading
// goroutine, as it arrives: f must not block. Call it before the first
// Watch.
func (p *Pipe) OnAwait(f func(Await)) { p.onAwait = f }

// OnSilent makes the pipe call f with the peer rank of every silent line
// (the worker heard nothing from that peer for SilentAfter), from its
// reading goroutine, as it arrives: f must not block. Call it before the
// first Watch.
func (p *Pipe) OnSilent(f func(peer int)) { p.onSilent = f }

// maxLine bounds a line on the channel: the start of a longer one is
// dropped, and so is the rest of it.
const maxLine = 64 << 10

// read reads the worker's lines until its end closes or Close.
func (p *Pipe) read() {
	defer close(p.done)
	rc, err := p.agent.SyscallConn()
	if err != nil {
		return
	}
	// The callback reads what is there and returns false to wait for more
	// (the runtime's poller); true only at end of file or an error.
	_ = rc.Read(func(fd uintptr) bool {
		p.readMu.Lock()
		defer p.readMu.Unlock()
		return p.readAvailable(int(fd))
	})
}

// Drain handles every line the worker wrote before Drain was called and
// returns: call it once the worker's process ended, so that what it said
// last (a requeue line) is known before its exit is acted on. It reads
// without blocking; a closed channel has nothing more to drain.
func (p *Pipe) Drain() {
	rc, err := p.agent.SyscallConn()
	if err != nil {
		return
	}
	p.readMu.Lock()
	defer p.readMu.Unlock()
	_ = rc.Control(func(fd uintptr) { p.readAvailable(int(fd)) })
}

// readAvailable reads the agent's end fd, which does not block, until
// nothing more is there, and handles each whole line; it reports whether
// the end is finished (end of file or an error other than "try again").
// The caller holds readMu.
func (p *Pipe) readAvailable(fd int) (finished bool) {
	var buf [4096]byte
	for {
		n, err := unix.Read(fd, buf[:])
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return false
		case err != nil || n == 0:
			return true
		}
		p.partial = append(p.partial, buf[:n]...)
		rest := p.partial
		for {
			line, after, ok := bytes.Cut(rest, []byte{'\n'})
			if !ok {
				break
			}
			p.handle(string(line))
			rest = after
		}
		if len(rest) > maxLine {
			rest = nil
		}
		p.partial = append(p.partial[:0], rest...)
	}
}

// Ready starts reading the worker's lines, if nothing did yet, and
// returns a channel that closes when the worker says it is ready (a
// ready line: a hot spare that built its trainer and awaits its first
// round), or never. Done closes when the worker's end is gone.
func (p *Pipe) Ready() <-chan struct{} {
	p.start.Do(func() { go p.read() })
	return p.ready
}

// Done closes when the worker's end of the channel is closed everywhere
// (the worker and its children are gone) or at Close.
func (p *Pipe) Done() <-chan struct{} { return p.done }

// handle takes one line from the worker; a line that is neither
// progress, an await, a silence, a ready nor a requeue line is ignored,
// as a newer worker may send others.
func (p *Pipe) handle(line string) {
	if strings.TrimSpace(line) == requeueWord {
		p.mu.Lock()
		p.requeued = true
		p.mu.Unlock()
		p.notify()
		return
	}
	if strings.TrimSpace(line) == readyWord {
		p.mu.Lock()
		if !p.isReady {
			p.isReady = true
			close(p.ready)
		}
		p.mu.Unlock()
		return
	}
	if peer, ok, err := ParseSilent(line); ok {
		if err == nil && p.onSilent != nil {
			p.onSilent(peer)
		}
		return
	}
	if a, ok, err := ParseAwait(line); ok {
		if err != nil {
			return
		}
		a.At = time.Now()
		p.mu.Lock()
		p.awaiting = &a
		p.mu.Unlock()
		if p.onAwait != nil {
			p.onAwait(a)
		}
		p.notify()
		return
	}
	prog, err := ParseLine(line)
	if err != nil {
		return
	}
	p.mu.Lock()
	p.lastStep, p.lastBeat, p.awaiting = prog.Step, time.Now(), nil
	p.beats++
	p.mu.Unlock()
	if p.onBeat != nil {
		p.onBeat(prog)
	}
	p.notify()
}

// notify wakes Watch, after the callbacks saw the line.
func (p *Pipe) notify() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.wake.Notify()
}

// Watch follows the worker for one round, until the worker's end closes
// or ctx ends (the channel itself stays open for the next round), and
// sends one Stall when, after a heartbeat in this Watch, none arrives
// within timeout. A worker that awaits a round (an await line) is not
// judged until its next heartbeat, which starts the timer again. A
// timeout of 0 or less never judges a stall (the lines still reach
// OnBeat and OnAwait). The channel closes when Watch is done.
func (p *Pipe) Watch(ctx context.Context, timeout time.Duration) <-chan Stall {
	p.start.Do(func() { go p.read() })
	out := make(chan Stall, 1)
	go func() {
		defer close(out)
		p.mu.Lock()
		seen := p.beats
		p.mu.Unlock()
		var timer <-chan time.Time
		for {
			p.mu.Lock()
			wake, beats, awaiting := p.wake.Changed(), p.beats, p.awaiting != nil
			p.mu.Unlock()
			switch {
			case awaiting:
				timer = nil
			case beats != seen && timeout > 0:
				timer = time.After(timeout)
			}
			seen = beats
			select {
			case <-wake:
			case <-timer:
				p.mu.Lock()
				out <- Stall{LastStep: p.lastStep, Silent: time.Since(p.lastBeat)}
				p.mu.Unlock()
				return
			case <-p.done:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// Awaiting returns the worker's await when it waits for a round (it
// wrote an await line and no progress since).
func (p *Pipe) Awaiting() (Await, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.awaiting == nil {
		return Await{}, false
	}
	return *p.awaiting, true
}

// Requeued says whether the worker said it stops to be requeued (a
// requeue line): it saved a checkpoint because its job is being
// requeued, whether or not this agent was passed the signal yet. Call
// Drain first once the worker ended.
func (p *Pipe) Requeued() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requeued
}

// LastStep is the last step the worker reported, -1 before the first.
func (p *Pipe) LastStep() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastStep
}

// SendRound gives the worker its contract w in the next round (a round
// line; with atBoundary, a next line: its world is intact, and it goes
// into the round at a step boundary its ranks agree on). It fails when
// the worker's end is gone, the channel is closed, or the worker has not
// read its channel for so long that the line does not fit within
// sendTimeout.
func (p *Pipe) SendRound(w distenv.Worker, atBoundary bool) error {
	line, err := RoundLine(w)
	if atBoundary {
		line, err = NextLine(w)
	}
	if err != nil {
		return err
	}
	if err := p.send(line); err != nil {
		return fmt.Errorf("heartbeat: send round to rank %d: %w", w.Rank, err)
	}
	return nil
}

// SendExec makes a warm worker the worker of its round, with env
// (KEY=VALUE) as its whole environment (ExecLine). It fails as SendRound.
func (p *Pipe) SendExec(env []string) error {
	line, err := ExecLine(env)
	if err != nil {
		return err
	}
	if err := p.send(line); err != nil {
		return fmt.Errorf("heartbeat: send exec: %w", err)
	}
	return nil
}

// send writes line to the worker within sendTimeout.
func (p *Pipe) send(line string) error {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	if err := p.agent.SetWriteDeadline(time.Now().Add(sendTimeout)); err != nil {
		return err
	}
	_, err := p.agent.WriteString(line)
	return err
}

// LastBeat is when the worker's last heartbeat arrived (zero before the
// first), on this host's clock.
func (p *Pipe) LastBeat() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastBeat
}

// Beater is the worker side of the channel. A nil Beater (no agent
// listening) does nothing, and has no rounds.
type Beater struct {
	f *os.File
}

// FromEnv returns the Beater the agent set up, or nil when there is none.
// The descriptor is made non-blocking, so that Rounds can stop reading
// when its context ends.
func FromEnv(lookup func(string) (string, bool)) *Beater {
	v, ok := lookup(EnvVar)
	if !ok {
		return nil
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 0 {
		return nil
	}
	return beaterOn(fd)
}

// beaterOn is the Beater on descriptor fd, made non-blocking; a
// descriptor that refuses stays blocking (Rounds then ends only at end of
// file).
func beaterOn(fd int) *Beater {
	_ = unix.SetNonblock(fd, true)
	return &Beater{f: os.NewFile(uintptr(fd), "heartbeat")}
}

// Close closes the worker's end of the channel (a nil Beater has none):
// the agent reads end of file, and Rounds and Follow end.
func (b *Beater) Close() error {
	if b == nil {
		return nil
	}
	return b.f.Close()
}

// Beat reports that step is done. Errors are ignored: an agent that went
// away has its own way of stopping the worker.
func (b *Beater) Beat(step int) {
	b.Report(Unreported(step))
}

// Report reports that p.Step is done, with the figures of p that are
// set. Errors are ignored, as Beat's.
func (b *Beater) Report(p Progress) {
	if b == nil {
		return
	}
	_, _ = b.f.WriteString(p.Line())
}

// Await tells the agent that the worker's world broke after step step
// completed, losing peer rank lostPeer (-1: unknown), and that it waits
// for its contract in the next round (Rounds) rather than exit: the
// agent does not judge it hung while it waits. Errors are ignored, as
// Beat's.
func (b *Beater) Await(step, lostPeer int) {
	if b == nil {
		return
	}
	_, _ = b.f.WriteString(Await{Step: step, LostPeer: lostPeer}.Line())
}

// Ready tells the agent that a hot spare (StandbyEnvVar) built its
// trainer and awaits its first round's contract. Errors are ignored, as
// Beat's.
func (b *Beater) Ready() {
	if b == nil {
		return
	}
	_, _ = b.f.WriteString(readyWord + "\n")
}

// Requeue tells the agent that the worker saved a checkpoint to stop for
// a requeue of the job (SIGUSR1 or SIGUSR2 here, or on a peer's node:
// the ranks agree on the stop) and is about to exit with
// distenv.ExitRequeue. The agent then takes that exit as a requeue even
// before SLURM's signal reaches its own node. Call it before exiting.
// Errors are ignored, as Beat's.
func (b *Beater) Requeue() {
	if b == nil {
		return
	}
	_, _ = b.f.WriteString(requeueWord + "\n")
}

// Silent tells the agent that the worker heard nothing from peer rank
// peer for SilentAfter while its world runs: the agent checks whether the
// peer's node can be reached (a network fault no lease shows). It changes
// nothing for the worker. Errors are ignored, as Beat's.
func (b *Beater) Silent(peer int) {
	if b == nil {
		return
	}
	_, _ = b.f.WriteString(SilentLine(peer))
}

// Rounds delivers the contracts the agent sends for the next rounds, in
// order. The channel closes when the agent's end closes (the agent is
// gone) or ctx ends; lines that are not round lines are skipped. Call it
// once. A nil Beater returns nil (a channel that never delivers).
func (b *Beater) Rounds(ctx context.Context) <-chan Contract {
	if b == nil {
		return nil
	}
	out := make(chan Contract, 1)
	go func() {
		defer close(out)
		stop := context.AfterFunc(ctx, func() { _ = b.f.SetReadDeadline(time.Now()) })
		defer stop()
		sc := bufio.NewScanner(b.f)
		for sc.Scan() {
			c, ok, err := ParseContract(sc.Text())
			if !ok || err != nil {
				continue
			}
			select {
			case out <- c:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}
