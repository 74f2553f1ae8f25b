package workerlog

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
	"unicode/utf8"
)

// maxLine is the longest line sent to the console or the tail in one piece; longer lines are split.
const maxLine = 64 << 10

// console is one of gorun's console streams, shared by all workers of a Sink.
type console struct {
	mu sync.Mutex
	w  io.Writer
	// owner is the stream whose line is still open on the console (no
	// newline after it yet), nil when the console is at the start of a
	// line; midline says whether owner's text is partly written (true)
	// or was ended with a carriage return (false).
	owner   *stream
	midline bool
	buf     []byte
}

// emit writes one segment of s's output in one Write call: text, then
// end ('\n', '\r', or 0 for a partial segment whose line goes on). A
// segment that starts a console line gets prefix; one that continues s's
// partly written line does not. When another stream's line is still open,
// a newline ends it first, so that no two workers share a console line.
func (c *console) emit(s *stream, prefix string, text []byte, end byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = c.buf[:0]
	if c.owner != nil && c.owner != s {
		c.buf = append(c.buf, '\n')
		c.owner = nil
	}
	cont := c.owner == s && c.midline     // s's text is partly written on the open line
	afterCR := c.owner == s && !c.midline // s ended its text there with a carriage return
	switch {
	case len(text) == 0 && end == 0:
	case len(text) == 0 && end == '\r':
		if cont {
			c.buf = append(c.buf, '\r')
			c.midline = false
		}
	case len(text) == 0 && end == '\n' && (cont || afterCR):
		c.buf = append(c.buf, '\n')
		c.owner = nil
	default:
		if !cont {
			c.buf = append(c.buf, prefix...)
		}
		c.buf = append(c.buf, text...)
		switch end {
		case 0:
			c.owner, c.midline = s, true
		case '\r':
			c.buf = append(c.buf, '\r')
			c.owner, c.midline = s, false
		default:
			c.buf = append(c.buf, '\n')
			c.owner = nil
		}
	}
	if len(c.buf) == 0 {
		return nil
	}
	_, err := c.w.Write(c.buf)
	return err
}

// endLine ends s's line if it is still open on the console.
func (c *console) endLine(s *stream) error {
	c.mu.Lock()
	open := c.owner == s
	c.mu.Unlock()
	if !open {
		return nil
	}
	return c.emit(s, "", nil, '\n')
}

// stream is one standard stream of one worker.
//
// Its output goes to the console in segments: a line at its newline, a
// progress line (tqdm) at each carriage return, and text without either
// once it waited flushAfter. The tail gets lines as a terminal shows them:
// what follows a carriage return replaces the line.
type stream struct {
	mu         sync.Mutex
	prefix     string
	console    *console      // nil: not shown, or dropped after an error
	file       *os.File      // nil: no file, or dropped after an error
	tail       *ring         // nil: no tail
	partial    []byte        // text not yet on the console, at most maxLine bytes
	line       []byte        // the line being collected for the tail, at most maxLine bytes
	overwrite  bool          // a carriage return ended line's text: the next text replaces it
	flushAfter time.Duration // 0: partial waits for its line's end
	timer      *time.Timer   // shows partial after flushAfter; nil until first needed
	armed      bool          // timer is set to fire
	err        error         // the first console or file error
	closed     bool
}

// isClosed reports whether close was called.
func (s *stream) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// enter makes the stream's output from now on go out with prefix, to
// console and file (either may be nil), closing the file it wrote before.
// A line left open on the old console is ended there; text not yet shown
// stays and goes to the new console. After close it closes file and
// returns os.ErrClosed.
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
	if s.console != nil && s.console != console {
		s.consoleErr(s.console.endLine(s))
	}
	s.prefix, s.console, s.file = prefix, console, file
	return nil
}

// Write writes p to the file as is, and its segments to the console and its lines to the tail.
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
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			s.text(p)
			s.arm()
			break
		}
		s.text(p[:i])
		s.end(p[i])
		p = p[i+1:]
	}
	return n, nil
}

// text takes text without line ends: for the tail's line and the console.
// Either is cut into lines of at most maxLine bytes.
func (s *stream) text(b []byte) {
	if len(b) == 0 {
		return
	}
	if s.overwrite {
		s.line, s.overwrite = s.line[:0], false
	}
	s.line = append(s.line, b...)
	for len(s.line) > maxLine {
		cut := splitPoint(s.line)
		s.addTail(s.line[:cut])
		s.line = append(s.line[:0], s.line[cut:]...)
	}
	s.partial = append(s.partial, b...)
	for len(s.partial) > maxLine {
		cut := splitPoint(s.partial)
		s.show(s.partial[:cut], '\n')
		s.partial = append(s.partial[:0], s.partial[cut:]...)
	}
	if cap(s.partial) > 4*maxLine {
		s.partial = bytes.Clone(s.partial) // do not keep the buffer of one huge write
	}
	if cap(s.line) > 4*maxLine {
		s.line = bytes.Clone(s.line)
	}
}

// end ends the current segment with a newline or a carriage return.
func (s *stream) end(c byte) {
	s.show(s.partial, c)
	s.partial = s.partial[:0]
	if c == '\n' {
		s.addTail(s.line)
		s.line, s.overwrite = s.line[:0], false
	} else {
		s.overwrite = true
	}
}

// arm makes the timer show partial text after flushAfter, unless it is set already.
func (s *stream) arm() {
	if s.flushAfter <= 0 || s.armed || len(s.partial) == 0 {
		return
	}
	s.armed = true
	if s.timer == nil {
		s.timer = time.AfterFunc(s.flushAfter, s.flush)
		return
	}
	s.timer.Reset(s.flushAfter)
}

// flush shows the partial text as it is: the timer's function.
func (s *stream) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armed = false
	if s.closed || len(s.partial) == 0 {
		return
	}
	s.show(s.partial, 0)
	s.partial = s.partial[:0]
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

// show sends one segment to the console (see console.emit).
func (s *stream) show(text []byte, end byte) {
	if s.console == nil {
		return
	}
	s.consoleErr(s.console.emit(s, s.prefix, text, end))
}

// consoleErr records a console error and drops the console.
func (s *stream) consoleErr(err error) {
	if err != nil {
		s.fail(fmt.Errorf("workerlog: write %sline to console: %w", s.prefix, err))
		s.console = nil
	}
}

// addTail adds one line to the tail.
func (s *stream) addTail(line []byte) {
	if s.tail != nil {
		s.tail.add(string(line))
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
	if len(s.line) > 0 && !s.closed {
		lines = append(lines, string(s.line))
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
	if s.timer != nil {
		s.timer.Stop()
	}
	if len(s.partial) > 0 {
		s.show(s.partial, '\n')
	} else if s.console != nil {
		s.consoleErr(s.console.endLine(s))
	}
	if len(s.line) > 0 {
		s.addTail(s.line)
	}
	s.partial, s.line = nil, nil
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
