// Package filetimer serves torch.distributed.elastic's file-based timer
// protocol: workers (torch's FileTimerClient) write JSON lines to a named
// pipe saying "kill me with this signal if scope S is not released by time
// T"; the server kills workers whose timers expire.
package filetimer

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Env names: torchrun serves the protocol when EnableEnv is "1" in the
// agent's environment, on the FIFO at PathEnv (default a new temporary
// path), and tells the workers PathEnv.
const (
	EnableEnv = "TORCHELASTIC_ENABLE_FILE_TIMER"
	PathEnv   = "TORCHELASTIC_TIMER_FILE"
)

// request is one line of the protocol (torch's FileTimerRequest.to_json).
// A negative expiration time releases the scope.
type request struct {
	Version        int     `json:"version"`
	PID            int     `json:"pid"`
	ScopeID        string  `json:"scope_id"`
	ExpirationTime float64 `json:"expiration_time"` // seconds since the epoch
	Signal         int     `json:"signal"`
}

// Expiry is a worker the server signalled because its timer ran out.
type Expiry struct {
	PID    int
	Scope  string
	Signal syscall.Signal
}

type timerKey struct {
	pid   int
	scope string
}

type timer struct {
	at     time.Time
	signal syscall.Signal
}

// Server reads the FIFO and kills expired workers. Its methods are safe
// for concurrent use.
type Server struct {
	path    string
	fifo    *os.File
	owns    func(pid int) bool
	expired chan Expiry

	mu     sync.Mutex
	timers map[timerKey]timer
	wake   chan struct{}
	done   chan struct{}
	closed sync.Once
	errs   error // of the first Close
}

// Bounds on what a worker can make the server hold: a line of the protocol
// is about 100 bytes; a longer one is skipped whole. Timers past maxTimers
// are ignored until some are released or fire.
const (
	maxLine   = 4 << 10
	maxTimers = 1 << 16
)

// Serve creates the FIFO at path (it must not exist) and serves it until
// ctx ends or Close. Only processes for which owns returns true are ever
// signalled: a line naming any other pid is ignored. Expiries are reported
// on Expired.
func Serve(ctx context.Context, path string, owns func(pid int) bool) (*Server, error) {
	if err := unix.Mkfifo(path, 0o600); err != nil {
		return nil, fmt.Errorf("filetimer: mkfifo %s: %w", path, err)
	}
	// Opened for reading and writing, so that open does not wait for a
	// writer and reads never see end of file when the workers come and go.
	fifo, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("filetimer: open %s: %w", path, err)
	}
	s := &Server{path: path, fifo: fifo, owns: owns, expired: make(chan Expiry, 16),
		timers: map[timerKey]timer{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go s.read()
	go s.expire(ctx)
	return s, nil
}

// Path is the FIFO's path, for the workers' TORCHELASTIC_TIMER_FILE.
func (s *Server) Path() string { return s.path }

// Expired reports the workers the server signalled.
func (s *Server) Expired() <-chan Expiry { return s.expired }

// Close stops serving and removes the FIFO. It may be called more than
// once, from any goroutine; later calls return the first one's error.
func (s *Server) Close() error {
	s.closed.Do(func() {
		close(s.done)
		s.errs = errors.Join(s.fifo.Close(), os.Remove(s.path))
	})
	return s.errs
}

// read takes requests from the FIFO until it is closed. A malformed line,
// or one longer than maxLine, is skipped; the next line is read as usual.
func (s *Server) read() {
	rd := bufio.NewReaderSize(s.fifo, maxLine)
	for {
		line, err := rd.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			for errors.Is(err, bufio.ErrBufferFull) { // the rest of an over-long line
				_, err = rd.ReadSlice('\n')
			}
			if err != nil {
				return
			}
			continue
		}
		if err != nil {
			return
		}
		s.take(line)
	}
}

// take applies one line of the protocol.
func (s *Server) take(line []byte) {
	var r request
	if json.Unmarshal(line, &r) != nil || r.PID <= 0 || !s.owns(r.PID) {
		return
	}
	key := timerKey{r.PID, r.ScopeID}
	s.mu.Lock()
	switch _, known := s.timers[key]; {
	case r.ExpirationTime < 0:
		delete(s.timers, key)
	case !known && len(s.timers) >= maxTimers:
		// Too many scopes open at once: ignore new ones.
	default:
		sec := int64(r.ExpirationTime)
		s.timers[key] = timer{at: time.Unix(sec, int64((r.ExpirationTime-float64(sec))*1e9)), signal: syscall.Signal(r.Signal)}
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// expire sleeps until the earliest timer, then signals its worker (and
// forgets every timer of that worker, as torch's server does).
func (s *Server) expire(ctx context.Context) {
	for {
		s.mu.Lock()
		var next time.Time
		now := time.Now()
		for key, t := range s.timers {
			if !t.at.After(now) {
				delete(s.timers, key)
				for k := range s.timers {
					if k.pid == key.pid {
						delete(s.timers, k)
					}
				}
				if t.signal > 0 && s.owns(key.pid) {
					_ = unix.Kill(key.pid, t.signal)
					select {
					case s.expired <- Expiry{PID: key.pid, Scope: key.scope, Signal: t.signal}:
					default:
					}
				}
				continue
			}
			if next.IsZero() || t.at.Before(next) {
				next = t.at
			}
		}
		s.mu.Unlock()
		var timerC <-chan time.Time
		if !next.IsZero() {
			timerC = time.After(time.Until(next))
		}
		select {
		case <-timerC:
		case <-s.wake:
		case <-s.done:
			return
		case <-ctx.Done():
			return
		}
	}
}
