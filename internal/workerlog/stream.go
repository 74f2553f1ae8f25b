package workerlog

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sync"
	"unicode/utf8"
)

// maxLine is the longest line sent to the console or the tail in one piece; longer lines are split.
const maxLine = 64 << 10

// console is one of gorun's console streams, shared by all workers of a Sink.
type console struct {
	mu sync.Mutex
	w  io.Writer
}

// write writes one whole line in one Write call.
func (c *console) write(line []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := c.w.Write(line)
	return err
}

// stream is one standard stream of one worker.
type stream struct {
	mu      sync.Mutex
	prefix  string
	console *console // nil: not shown, or dropped after an error
	file    *os.File // nil: no file, or dropped after an error
	tail    *ring    // nil: no tail
	partial []byte   // the line being collected, at most maxLine bytes
	scratch []byte   // prefix + line + newline, for the console
	err     error    // the first console or file error
	closed  bool
}

// isClosed reports whether close was called.
func (s *stream) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// enter makes the stream's output from now on go out with prefix, to
// console and file (either may be nil), closing the file it wrote before.
// The line being collected stays: it goes out at its newline, in the new
// place. After close it closes file and returns os.ErrClosed.
func (s *stream) enter(prefix string, console *console, file *os.File) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		if file != nil {
			_ = file.Close()
		}
		return os.ErrClosed
	}
	if s.file != nil {
		if err := s.file.Close(); err != nil {
			s.fail(fmt.Errorf("workerlog: close log file: %w", err))
		}
	}
	s.prefix, s.console, s.file = prefix, console, file
	return nil
}

// Write writes p to the file as is, and whole lines of it to the console and the tail.
func (s *stream) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, os.ErrClosed
	}
	if s.file != nil {
		if _, err := s.file.Write(p); err != nil {
			s.fail(fmt.Errorf("workerlog: write log file: %w", err))
			_ = s.file.Close()
			s.file = nil
		}
	}
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.partial = append(s.partial, p...)
			for len(s.partial) > maxLine {
				cut := splitPoint(s.partial)
				s.line(s.partial[:cut])
				s.partial = append(s.partial[:0], s.partial[cut:]...)
			}
			if cap(s.partial) > 4*maxLine {
				s.partial = bytes.Clone(s.partial) // do not keep the buffer of one huge write
			}
			break
		}
		if len(s.partial) > 0 {
			s.partial = append(s.partial, p[:i]...)
			s.longLine(s.partial)
			s.partial = s.partial[:0]
		} else {
			s.longLine(p[:i])
		}
		p = p[i+1:]
	}
	return n, nil
}

// longLine sends line, without its newline, as lines of at most maxLine bytes.
func (s *stream) longLine(line []byte) {
	for len(line) > maxLine {
		cut := splitPoint(line)
		s.line(line[:cut])
		line = line[cut:]
	}
	s.line(line)
}

// splitPoint returns where to split b, longer than maxLine: at maxLine, or up to 3 bytes before so
// that a UTF-8 sequence is not cut.
func splitPoint(b []byte) int {
	for cut := maxLine; cut > maxLine-utf8.UTFMax; cut-- {
		if utf8.RuneStart(b[cut]) {
			return cut
		}
	}
	return maxLine
}

// line sends one line, without its newline, to the console and the tail.
func (s *stream) line(line []byte) {
	if s.tail != nil {
		s.tail.add(string(line))
	}
	if s.console == nil {
		return
	}
	s.scratch = append(append(append(s.scratch[:0], s.prefix...), line...), '\n')
	if err := s.console.write(s.scratch); err != nil {
		s.fail(fmt.Errorf("workerlog: write %sline to console: %w", s.prefix, err))
		s.console = nil
	}
}

// fail records err if it is the stream's first.
func (s *stream) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

// tailLines returns the tail plus the line being collected.
func (s *stream) tailLines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tail == nil {
		return nil
	}
	lines := s.tail.lines()
	if len(s.partial) > 0 && !s.closed {
		lines = append(lines, string(s.partial))
		if len(lines) > s.tail.size() {
			lines = lines[1:]
		}
	}
	return lines
}

// close flushes the final line without newline and closes the file; it returns the first error.
func (s *stream) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if len(s.partial) > 0 {
		s.line(s.partial)
		s.partial = nil
	}
	if s.file != nil {
		if err := s.file.Close(); err != nil {
			s.fail(fmt.Errorf("workerlog: close log file: %w", err))
		}
		s.file = nil
	}
	return s.err
}

// ring keeps the last n strings added to it.
type ring struct {
	buf  []string
	next int // where the next string goes, once buf is full
}

// newRing returns a ring of n strings, or nil for n <= 0.
func newRing(n int) *ring {
	if n <= 0 {
		return nil
	}
	return &ring{buf: make([]string, 0, n)}
}

func (r *ring) size() int {
	return cap(r.buf)
}

func (r *ring) add(s string) {
	if len(r.buf) < cap(r.buf) {
		r.buf = append(r.buf, s)
		return
	}
	r.buf[r.next] = s
	r.next = (r.next + 1) % len(r.buf)
}

// lines returns the strings, oldest first.
func (r *ring) lines() []string {
	out := make([]string, 0, len(r.buf))
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}
