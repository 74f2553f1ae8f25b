package workerlog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultFlushAfter is how long gorun lets a worker's unfinished line (text
// not yet ended by a newline or a carriage return) wait before it shows it.
const DefaultFlushAfter = 100 * time.Millisecond

// DefaultTailLines is how many lines of stderr a Worker keeps when Config.TailLines is 0.
const DefaultTailLines = 20

// Config configures the output of one attempt's workers.
type Config struct {
	// Host names this node in console prefixes, "[host:rank] ". Required.
	Host string
	// Role is the workers' role name, for ${role_name} in PrefixTemplate.
	Role string
	// PrefixTemplate, when not nil, makes the console prefix of each line:
	// torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, expanded by
	// ExpandPrefix ("" shows lines without a prefix). Nil is gorun's
	// "[host:rank] ".
	PrefixTemplate *string
	// FlushAfter is how long a worker's unfinished line waits before the
	// console shows what there is of it; the rest of the line follows on the
	// same console line when no other worker wrote in between, else on a
	// new one with the prefix. 0 holds it until its newline or carriage
	// return (or 64 KiB). Lines ended by a carriage return (progress bars)
	// are shown at once, each with the prefix.
	FlushAfter time.Duration
	// RunID and Attempt name the attempt's log directory, Dir/RunID/attempt_<Attempt>. RunID must
	// be a single path element when Dir is set; Attempt must not be negative.
	RunID   string
	Attempt int
	// Dir is the log directory (torchrun's --log-dir); empty means no files. With a Dir, both
	// streams of every rank are always written, unprefixed, to
	// Dir/RunID/attempt_<Attempt>/<rank>/stdout.log and stderr.log (rank is the global rank).
	Dir string
	// Redirects (torchrun's --redirects) are streams, per local rank, kept off the console: they
	// only go to the files. Redirects need a Dir, or the output would be lost: when the user gives
	// --redirects or --tee without --log-dir, the caller creates a temporary Dir, as torchrun does.
	Redirects StdSpec
	// Tee (torchrun's --tee) are streams, per local rank, shown on the console as well as written
	// to the files. Since files always get everything, Tee only matters where it overrides
	// Redirects: a stream in both is shown.
	Tee StdSpec
	// LocalRanksFilter (torchrun's --local-ranks-filter) lists the local ranks shown on the
	// console; empty shows all. Files and tails are not affected.
	LocalRanksFilter []int
	// Stdout and Stderr are gorun's console, which get the workers' stdout and stderr lines; nil
	// discards. Each console line is one Write call: to share a stream with other writers without
	// lines interleaving, give a writer that serializes its Writes (like zerolog.SyncWriter).
	Stdout, Stderr io.Writer
	// TailLines is how many last lines of stderr each Worker keeps for Tail: 0 means
	// DefaultTailLines, a negative value none.
	TailLines int
}

// Validate reports the first problem with c, or nil.
func (c Config) Validate() error {
	if c.Host == "" {
		return errors.New("workerlog: Config.Host is empty")
	}
	if c.FlushAfter < 0 {
		return fmt.Errorf("workerlog: Config.FlushAfter is negative (%s)", c.FlushAfter)
	}
	if c.Attempt < 0 {
		return fmt.Errorf("workerlog: Config.Attempt is negative (%d)", c.Attempt)
	}
	if c.Dir != "" {
		if c.RunID == "" || c.RunID == "." || c.RunID == ".." || strings.ContainsAny(c.RunID, "/\x00") {
			return fmt.Errorf("workerlog: Config.RunID %q is not a single path element", c.RunID)
		}
	} else if !c.Redirects.IsZero() {
		return fmt.Errorf("workerlog: Config.Redirects %q without a log Dir would lose that output; "+
			"give a Dir (a temporary one when the user gave none)", c.Redirects)
	}
	for _, r := range c.LocalRanksFilter {
		if r < 0 {
			return fmt.Errorf("workerlog: Config.LocalRanksFilter has a negative local rank (%d)", r)
		}
	}
	return nil
}

// Sink routes the output of one attempt's workers. It owns one lock per console stream, so lines of
// different workers never interleave. It is safe for concurrent use.
type Sink struct {
	cfg        Config
	attemptDir string       // "" without Dir
	filter     map[int]bool // local ranks shown on the console; nil: all
	stdout     *console     // gorun's stdout
	stderr     *console     // gorun's stderr
	tailLines  int          // 0: no tail
	mu         sync.Mutex   // guards ranks
	ranks      map[int]bool // global ranks that have a Worker
}

// New returns a Sink for cfg. It fails if cfg is invalid (see Config.Validate). It creates no
// files: Worker does.
func New(cfg Config) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Sink{
		cfg:       cfg,
		stdout:    &console{w: orDiscard(cfg.Stdout)},
		stderr:    &console{w: orDiscard(cfg.Stderr)},
		tailLines: cfg.TailLines,
		ranks:     make(map[int]bool),
	}
	if cfg.Dir != "" {
		s.attemptDir = filepath.Join(cfg.Dir, cfg.RunID, "attempt_"+strconv.Itoa(cfg.Attempt))
	}
	if len(cfg.LocalRanksFilter) > 0 {
		s.filter = make(map[int]bool)
		for _, r := range cfg.LocalRanksFilter {
			s.filter[r] = true
		}
	}
	switch {
	case s.tailLines == 0:
		s.tailLines = DefaultTailLines
	case s.tailLines < 0:
		s.tailLines = 0
	}
	return s, nil
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// onConsole reports whether stream std of localRank is shown on the console.
func (s *Sink) onConsole(localRank int, std Std) bool {
	if s.filter != nil && !s.filter[localRank] {
		return false
	}
	return !s.cfg.Redirects.For(localRank).Has(std) || s.cfg.Tee.For(localRank).Has(std)
}

// Worker returns the output of the worker with global rank rank and local rank localRank. With a
// Dir it creates the rank's directory (0755) and opens stdout.log and stderr.log for appending, so
// a rerun of the same attempt adds to them. It fails if a rank is negative, if rank already has a
// Worker in this Sink, or if a directory or file cannot be created (the error names the path);
// then nothing is left open.
func (s *Sink) Worker(rank, localRank int) (*Worker, error) {
	pl, err := s.place(rank, localRank)
	if err != nil {
		return nil, err
	}
	w := &Worker{
		stdout: &stream{flushAfter: s.cfg.FlushAfter},
		stderr: &stream{tail: newRing(s.tailLines), flushAfter: s.cfg.FlushAfter},
	}
	w.stdout.enter(pl.prefix, pl.stdoutConsole, pl.stdoutFile)
	w.stderr.enter(pl.prefix, pl.stderrConsole, pl.stderrFile)
	w.dir.Store(&pl.dir)
	return w, nil
}

// place is where one rank's output goes in a Sink.
type place struct {
	prefix                       string
	stdoutConsole, stderrConsole *console // nil: not shown
	dir                          string   // "" without Dir
	stdoutFile, stderrFile       *os.File // nil without Dir
}

// place registers rank in s and opens its files; see Worker.
func (s *Sink) place(rank, localRank int) (place, error) {
	if rank < 0 || localRank < 0 {
		return place{}, fmt.Errorf("workerlog: negative rank %d or local rank %d", rank, localRank)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ranks[rank] {
		return place{}, fmt.Errorf("workerlog: rank %d already has a Worker", rank)
	}
	pl := place{prefix: "[" + s.cfg.Host + ":" + strconv.Itoa(rank) + "] "}
	if s.cfg.PrefixTemplate != nil {
		pl.prefix = ExpandPrefix(*s.cfg.PrefixTemplate, PrefixVars{
			Rank: rank, LocalRank: localRank, RoleName: s.cfg.Role, Hostname: s.cfg.Host,
		})
	}
	if s.onConsole(localRank, Stdout) {
		pl.stdoutConsole = s.stdout
	}
	if s.onConsole(localRank, Stderr) {
		pl.stderrConsole = s.stderr
	}
	if s.attemptDir != "" {
		pl.dir = filepath.Join(s.attemptDir, strconv.Itoa(rank))
		if err := os.MkdirAll(pl.dir, 0o755); err != nil {
			return place{}, fmt.Errorf("workerlog: create log directory: %w", err)
		}
		var err error
		if pl.stdoutFile, err = openLog(filepath.Join(pl.dir, "stdout.log")); err != nil {
			return place{}, err
		}
		if pl.stderrFile, err = openLog(filepath.Join(pl.dir, "stderr.log")); err != nil {
			_ = pl.stdoutFile.Close()
			return place{}, err
		}
	}
	s.ranks[rank] = true
	return pl, nil
}

// Vacate frees rank's place in s for another Worker, once the one that
// holds it is closed: a kept worker that died as it was moved here, whose
// replacement takes its rank.
func (s *Sink) Vacate(rank int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ranks, rank)
}

// Move makes w's output from now on that of rank (local rank localRank)
// in s, the Sink of a later attempt: for a worker kept across attempts
// (recovered in place), whose rank may have changed. Its console lines
// take the new prefix and filter; with a log Dir, what it writes next goes
// to its files in s's attempt directory, and the files written so far stay
// as they are. The line being collected and the tail of stderr go along.
// On error (see Sink.Worker) w is unchanged. After Close it returns
// os.ErrClosed.
func (w *Worker) Move(s *Sink, rank, localRank int) error {
	if w.stdout.isClosed() {
		return os.ErrClosed
	}
	pl, err := s.place(rank, localRank)
	if err != nil {
		return err
	}
	errOut := w.stdout.enter(pl.prefix, pl.stdoutConsole, pl.stdoutFile)
	errErr := w.stderr.enter(pl.prefix, pl.stderrConsole, pl.stderrFile)
	w.dir.Store(&pl.dir)
	return errors.Join(errOut, errErr)
}

// openLog opens a log file for appending, creating it 0644.
func openLog(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("workerlog: open log file: %w", err)
	}
	return f, nil
}

// Worker is the output of one worker: writers for its stdout and stderr, and the tail of its
// stderr. Its methods are safe for concurrent use.
type Worker struct {
	dir    atomic.Pointer[string]
	stdout *stream
	stderr *stream
}

// Stdout returns the writer for the worker's stdout; give it to proc.Spec.Stdout.
//
// Its Write never blocks on anything but the console and the file, and never fails because of
// them: a failing console or file is dropped from that stream and its first error is returned by
// Close, so that the worker's output is always drained. It fails only after Close (os.ErrClosed).
func (w *Worker) Stdout() io.Writer {
	return w.stdout
}

// Stderr returns the writer for the worker's stderr, which also feeds Tail; see Stdout.
func (w *Worker) Stderr() io.Writer {
	return w.stderr
}

// Dir returns the directory of the worker's log files, or "" without a log Dir.
func (w *Worker) Dir() string {
	return *w.dir.Load()
}

// Tail returns the last lines of the worker's stderr, oldest first, without their newlines,
// including a final line without newline. Lines longer than 64 KiB count as several.
func (w *Worker) Tail() []string {
	return w.stderr.tailLines()
}

// Close writes out both streams' final lines without newline, closes the log files, and returns
// the first console or file error of each stream, joined. Later calls return nil.
func (w *Worker) Close() error {
	return errors.Join(w.stdout.close(), w.stderr.close())
}
