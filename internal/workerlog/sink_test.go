package workerlog_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gorun/gorun/internal/workerlog"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// consoles returns a Config with console buffers; bytes.Buffer is not safe for concurrent use, so
// the race detector checks that the Sink serializes writes to it.
func consoles() (workerlog.Config, *bytes.Buffer, *bytes.Buffer) {
	var stdout, stderr bytes.Buffer
	return workerlog.Config{Host: "h", RunID: "run", Stdout: &stdout, Stderr: &stderr}, &stdout, &stderr
}

func newWorker(t *testing.T, cfg workerlog.Config, rank, localRank int) *workerlog.Worker {
	t.Helper()
	sink, err := workerlog.New(cfg)
	require.NoError(t, err)
	w, err := sink.Worker(rank, localRank)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	return w
}

func write(t *testing.T, w io.Writer, chunks ...string) {
	t.Helper()
	for _, c := range chunks {
		n, err := io.WriteString(w, c)
		require.NoError(t, err)
		require.Equal(t, len(c), n)
	}
}

func TestConsoleLines(t *testing.T) {
	tests := []struct {
		name        string
		chunks      []string
		beforeClose string
		afterClose  string
	}{
		{"whole lines", []string{"a\nb\n"}, "[h:3] a\n[h:3] b\n", "[h:3] a\n[h:3] b\n"},
		{"lines across writes", []string{"a", "b\nc", "\n"}, "[h:3] ab\n[h:3] c\n", "[h:3] ab\n[h:3] c\n"},
		{"final partial line", []string{"x\ny"}, "[h:3] x\n", "[h:3] x\n[h:3] y\n"},
		{"only a partial line", []string{"p", "q"}, "", "[h:3] pq\n"},
		{"empty lines", []string{"\n\n"}, "[h:3] \n[h:3] \n", "[h:3] \n[h:3] \n"},
		{"carriage return kept", []string{"a\r\n"}, "[h:3] a\r\n", "[h:3] a\r\n"},
		{"no output", nil, "", ""},
	}
	for _, tt := range tests {
		for _, stream := range []string{"stdout", "stderr"} {
			t.Run(tt.name+"/"+stream, func(t *testing.T) {
				cfg, stdout, stderr := consoles()
				w := newWorker(t, cfg, 3, 1)
				target, other, wr := stdout, stderr, w.Stdout()
				if stream == "stderr" {
					target, other, wr = stderr, stdout, w.Stderr()
				}
				write(t, wr, tt.chunks...)
				assert.Equal(t, tt.beforeClose, target.String())
				require.NoError(t, w.Close())
				assert.Equal(t, tt.afterClose, target.String())
				assert.Empty(t, other.String())
			})
		}
	}
}

// consoleLines splits console output into lines without the prefix, checking the prefix.
func consoleLines(t *testing.T, out, prefix string) []string {
	t.Helper()
	if out == "" {
		return nil
	}
	require.True(t, strings.HasSuffix(out, "\n"), "console output ends with a newline")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for i, l := range lines {
		require.True(t, strings.HasPrefix(l, prefix), "line %d has prefix %q", i, prefix)
		lines[i] = strings.TrimPrefix(l, prefix)
	}
	return lines
}

func TestLongLines(t *testing.T) {
	const max = 64 << 10
	ascii := strings.Repeat("0123456789", 20<<10) // 200 KiB
	// "€" is 3 bytes, so 64 KiB boundaries fall inside runes.
	runes := "a" + strings.Repeat("€", 70<<10)
	tests := []struct {
		name   string
		line   string
		chunk  int  // write in chunks of this size; 0: one write
		eol    bool // end with a newline
		pieces int
	}{
		{"one write", ascii + "\n", 0, true, 4},
		{"small writes", ascii + "\n", 1000, true, 4},
		{"no newline", ascii, 4096, false, 4},
		{"exactly max", ascii[:max] + "\n", 0, true, 1},
		{"max plus one", ascii[:max+1] + "\n", 0, true, 2},
		{"utf-8", runes + "\n", 32 << 10, true, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, stdout, _ := consoles()
			cfg.TailLines = 100
			w := newWorker(t, cfg, 0, 0)
			for _, wr := range []io.Writer{w.Stdout(), w.Stderr()} {
				if tt.chunk == 0 {
					write(t, wr, tt.line)
					continue
				}
				for s := tt.line; s != ""; {
					n := min(tt.chunk, len(s))
					write(t, wr, s[:n])
					s = s[n:]
				}
			}
			require.NoError(t, w.Close())

			lines := consoleLines(t, stdout.String(), "[h:0] ")
			assert.Len(t, lines, tt.pieces)
			for i, l := range lines {
				assert.LessOrEqual(t, len(l), max, "piece %d", i)
				assert.True(t, utf8.ValidString(l), "piece %d is valid UTF-8", i)
			}
			want := strings.TrimSuffix(tt.line, "\n")
			assert.Equal(t, want, strings.Join(lines, ""), "nothing is lost")
			assert.Equal(t, lines, w.Tail(), "the tail has the same pieces")
		})
	}
}

// Many workers write lines of many lengths in chunks of many sizes, from one goroutine per stream;
// every console line must be whole, from one worker, and in that worker's order.
func TestConcurrentWorkers(t *testing.T) {
	const workers, lines = 8, 300
	cfg, stdout, stderr := consoles()
	sink, err := workerlog.New(cfg)
	require.NoError(t, err)

	var wg sync.WaitGroup
	ws := make([]*workerlog.Worker, workers)
	for rank := range workers {
		ws[rank], err = sink.Worker(rank, rank%4)
		require.NoError(t, err)
		for _, s := range []struct {
			name string
			w    io.Writer
		}{{"out", ws[rank].Stdout()}, {"err", ws[rank].Stderr()}} {
			wg.Go(func() {
				rnd := rand.New(rand.NewPCG(uint64(rank), uint64(len(s.name))))
				var buf bytes.Buffer
				for i := range lines {
					fmt.Fprintf(&buf, "%s r%d %d %s\n", s.name, rank, i, strings.Repeat("x", rnd.IntN(3000)))
				}
				data := buf.Bytes()
				for len(data) > 0 {
					n := min(1+rnd.IntN(5000), len(data))
					if _, err := s.w.Write(data[:n]); err != nil {
						panic(err)
					}
					data = data[n:]
				}
			})
		}
	}
	wg.Wait()
	for _, w := range ws {
		require.NoError(t, w.Close())
	}

	re := regexp.MustCompile(`^\[h:(\d+)\] (out|err) r(\d+) (\d+) x*$`)
	for _, c := range []struct {
		name string
		out  string
	}{{"out", stdout.String()}, {"err", stderr.String()}} {
		next := make([]int, workers)
		sc := bufio.NewScanner(strings.NewReader(c.out))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			m := re.FindStringSubmatch(sc.Text())
			require.NotNil(t, m, "malformed console line %.100q", sc.Text())
			assert.Equal(t, m[1], m[3], "prefix rank matches the writer")
			assert.Equal(t, c.name, m[2], "line on the right console stream")
			rank, _ := strconv.Atoi(m[1])
			i, _ := strconv.Atoi(m[4])
			require.Equal(t, next[rank], i, "rank %d lines in order", rank)
			next[rank]++
		}
		require.NoError(t, sc.Err())
		for rank, n := range next {
			assert.Equal(t, lines, n, "all lines of rank %d on %s", rank, c.name)
		}
	}
}

// umask returns the process umask, which applies to the directories and files created.
func umask(t *testing.T) os.FileMode {
	status, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^Umask:\s*([0-7]+)$`).FindSubmatch(status)
	require.NotNil(t, m)
	u, err := strconv.ParseUint(string(m[1]), 8, 32)
	require.NoError(t, err)
	return os.FileMode(u)
}

func TestFiles(t *testing.T) {
	dir := t.TempDir()
	cfg, stdout, stderr := consoles()
	cfg.Dir, cfg.RunID, cfg.Attempt = dir, "job-42", 2
	cfg.Redirects = workerlog.AllRanks(workerlog.Stdout | workerlog.Stderr)
	sink, err := workerlog.New(cfg)
	require.NoError(t, err)

	w4, err := sink.Worker(4, 0)
	require.NoError(t, err)
	w5, err := sink.Worker(5, 1)
	require.NoError(t, err)
	write(t, w4.Stdout(), "out of 4\n", "partial")
	write(t, w4.Stderr(), "err of 4\n")
	write(t, w5.Stderr(), "err of 5\n")
	require.NoError(t, w4.Close())
	require.NoError(t, w5.Close())

	attempt := filepath.Join(dir, "job-42", "attempt_2")
	assert.Equal(t, filepath.Join(attempt, "4"), w4.Dir())
	want := map[string]string{
		"4/stdout.log": "out of 4\npartial",
		"4/stderr.log": "err of 4\n",
		"5/stdout.log": "",
		"5/stderr.log": "err of 5\n",
	}
	for name, content := range want {
		data, err := os.ReadFile(filepath.Join(attempt, name))
		require.NoError(t, err, name)
		assert.Equal(t, content, string(data), name)
	}
	for _, d := range []string{filepath.Join(dir, "job-42"), attempt, w4.Dir()} {
		fi, err := os.Stat(d)
		require.NoError(t, err)
		assert.True(t, fi.IsDir())
		assert.Equal(t, 0o755&^umask(t), fi.Mode().Perm(), d)
	}
	assert.Empty(t, stdout.String(), "redirected")
	assert.Empty(t, stderr.String(), "redirected")

	// Another Sink for the same attempt appends rather than truncating.
	again, err := workerlog.New(cfg)
	require.NoError(t, err)
	w4b, err := again.Worker(4, 0)
	require.NoError(t, err)
	write(t, w4b.Stdout(), "\nmore\n")
	require.NoError(t, w4b.Close())
	data, err := os.ReadFile(filepath.Join(attempt, "4", "stdout.log"))
	require.NoError(t, err)
	assert.Equal(t, "out of 4\npartial\nmore\n", string(data))
}

// TestMove: a worker kept into a later attempt under another rank goes
// on in the new attempt's files and with the new rank's prefix and console
// filter; its unfinished line and its tail go along; the old files stay.
func TestMove(t *testing.T) {
	dir := t.TempDir()
	cfg, stdout, stderr := consoles()
	cfg.Dir, cfg.RunID, cfg.TailLines = dir, "job", 3
	cfg.LocalRanksFilter = []int{0} // local rank 1 is off the console
	first, err := workerlog.New(cfg)
	require.NoError(t, err)
	cfg.Attempt = 1
	second, err := workerlog.New(cfg)
	require.NoError(t, err)

	w, err := first.Worker(3, 1)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	write(t, w.Stdout(), "before\n", "half")
	write(t, w.Stderr(), "err before\n")
	require.NoError(t, w.Move(second, 1, 0))
	write(t, w.Stdout(), " a line\n", "after\n")
	write(t, w.Stderr(), "err after\n")

	taken, err := second.Worker(2, 1)
	require.NoError(t, err)
	t.Cleanup(func() { _ = taken.Close() })
	require.ErrorContains(t, w.Move(second, 2, 1), "rank 2 already has a Worker")
	write(t, w.Stdout(), "still rank 1\n")
	require.NoError(t, w.Close())
	require.ErrorIs(t, w.Move(second, 5, 0), os.ErrClosed)

	assert.Equal(t, filepath.Join(dir, "job", "attempt_1", "1"), w.Dir())
	assert.Equal(t, "[h:1] half a line\n[h:1] after\n[h:1] still rank 1\n", stdout.String())
	assert.Equal(t, "[h:1] err after\n", stderr.String())
	assert.Equal(t, []string{"err before", "err after"}, w.Tail())
	for name, content := range map[string]string{
		"attempt_0/3/stdout.log": "before\nhalf",
		"attempt_0/3/stderr.log": "err before\n",
		"attempt_1/1/stdout.log": " a line\nafter\nstill rank 1\n",
		"attempt_1/1/stderr.log": "err after\n",
	} {
		data, err := os.ReadFile(filepath.Join(dir, "job", name))
		require.NoError(t, err, name)
		assert.Equal(t, content, string(data), name)
	}
	_, err = os.Stat(filepath.Join(dir, "job", "attempt_1", "5"))
	require.ErrorIs(t, err, os.ErrNotExist, "a failed Move leaves nothing")

	// A worker that died as it was moved (closed above) leaves its rank to
	// the one restarted in its place once vacated, which appends.
	_, err = second.Worker(1, 0)
	require.ErrorContains(t, err, "rank 1 already has a Worker")
	second.Vacate(1)
	fresh, err := second.Worker(1, 0)
	require.NoError(t, err)
	write(t, fresh.Stdout(), "fresh\n")
	require.NoError(t, fresh.Close())
	data, err := os.ReadFile(filepath.Join(dir, "job", "attempt_1", "1", "stdout.log"))
	require.NoError(t, err)
	assert.Equal(t, " a line\nafter\nstill rank 1\nfresh\n", string(data))
}

func TestConsoleRouting(t *testing.T) {
	mustStd := func(s string) workerlog.StdSpec {
		spec, err := workerlog.ParseStd(s)
		require.NoError(t, err)
		return spec
	}
	tests := []struct {
		name      string
		noDir     bool
		redirects string
		tee       string
		filter    []int
		// what reaches the console from local rank 0 (global 10) and local rank 1 (global 11)
		wantOut, wantErr string
	}{
		{"defaults", false, "", "", nil, "[h:10] o\n[h:11] o\n", "[h:10] e\n[h:11] e\n"},
		{"no log dir", true, "", "", nil, "[h:10] o\n[h:11] o\n", "[h:10] e\n[h:11] e\n"},
		{"tee only", false, "", "3", nil, "[h:10] o\n[h:11] o\n", "[h:10] e\n[h:11] e\n"},
		{"tee without log dir", true, "", "3", nil, "[h:10] o\n[h:11] o\n", "[h:10] e\n[h:11] e\n"},
		{"redirect both", false, "3", "", nil, "", ""},
		{"redirect stdout", false, "1", "", nil, "", "[h:10] e\n[h:11] e\n"},
		{"redirect local rank 0", false, "0:3", "", nil, "[h:11] o\n", "[h:11] e\n"},
		{"tee overrides redirect", false, "3", "2", nil, "", "[h:10] e\n[h:11] e\n"},
		{"per-rank redirect and tee", false, "0:3,1:1", "1:1", nil, "[h:11] o\n", "[h:11] e\n"},
		{"filter", false, "", "", []int{1}, "[h:11] o\n", "[h:11] e\n"},
		{"filter and redirect", false, "2", "", []int{0}, "[h:10] o\n", ""},
		{"filter of absent rank", false, "", "", []int{5}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, stdout, stderr := consoles()
			if !tt.noDir {
				cfg.Dir = t.TempDir()
			}
			cfg.Redirects, cfg.Tee, cfg.LocalRanksFilter = mustStd(tt.redirects), mustStd(tt.tee), tt.filter
			sink, err := workerlog.New(cfg)
			require.NoError(t, err)
			for lr := range 2 {
				w, err := sink.Worker(10+lr, lr)
				require.NoError(t, err)
				write(t, w.Stdout(), "o\n")
				write(t, w.Stderr(), "e\n")
				require.NoError(t, w.Close())
				assert.Equal(t, []string{"e"}, w.Tail(), "the tail ignores console settings")
				if !tt.noDir {
					for name, want := range map[string]string{"stdout.log": "o\n", "stderr.log": "e\n"} {
						data, err := os.ReadFile(filepath.Join(w.Dir(), name))
						require.NoError(t, err)
						assert.Equal(t, want, string(data), "files get everything")
					}
				}
			}
			assert.Equal(t, tt.wantOut, stdout.String())
			assert.Equal(t, tt.wantErr, stderr.String())
		})
	}
}

func TestTail(t *testing.T) {
	numbered := func(from, to int) []string {
		var s []string
		for i := from; i <= to; i++ {
			s = append(s, strconv.Itoa(i))
		}
		return s
	}
	tests := []struct {
		name       string
		tailLines  int
		stderr     string
		wantBefore []string // before Close
		wantAfter  []string
	}{
		{"last lines", 3, "1\n2\n3\n4\n5\n", numbered(3, 5), numbered(3, 5)},
		{"with a partial line", 3, "1\n2\n3\n4\n5", numbered(3, 5), numbered(3, 5)},
		{"fewer lines than kept", 3, "1\n2\n", numbered(1, 2), numbered(1, 2)},
		{"default", 0, strings.Join(numbered(1, 30), "\n") + "\n", numbered(11, 30), numbered(11, 30)},
		{"disabled", -1, "1\n2\n", nil, nil},
		{"nothing written", 3, "", []string{}, []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, _, _ := consoles()
			cfg.TailLines = tt.tailLines
			cfg.Dir = t.TempDir()
			cfg.Redirects = workerlog.AllRanks(workerlog.Stderr) // the tail ignores redirects
			w := newWorker(t, cfg, 0, 0)
			write(t, w.Stdout(), "stdout is not in the tail\n")
			write(t, w.Stderr(), tt.stderr)
			assert.Equal(t, tt.wantBefore, w.Tail())
			require.NoError(t, w.Close())
			assert.Equal(t, tt.wantAfter, w.Tail())
		})
	}
}

func TestConfigInvalid(t *testing.T) {
	valid, _, _ := consoles()
	tests := []struct {
		name    string
		edit    func(*workerlog.Config)
		wantErr string
	}{
		{"no host", func(c *workerlog.Config) { c.Host = "" }, "Host is empty"},
		{"negative attempt", func(c *workerlog.Config) { c.Attempt = -1 }, "Attempt is negative"},
		{"empty run ID", func(c *workerlog.Config) { c.Dir, c.RunID = "/tmp", "" }, `RunID ""`},
		{"run ID with slash", func(c *workerlog.Config) { c.Dir, c.RunID = "/tmp", "a/b" }, `RunID "a/b"`},
		{"run ID dot-dot", func(c *workerlog.Config) { c.Dir, c.RunID = "/tmp", ".." }, `RunID ".."`},
		{"redirects without dir", func(c *workerlog.Config) { c.Redirects = workerlog.AllRanks(workerlog.Stdout) }, "without a log Dir"},
		{"negative filter rank", func(c *workerlog.Config) { c.LocalRanksFilter = []int{0, -2} }, "negative local rank (-2)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid
			tt.edit(&cfg)
			sink, err := workerlog.New(cfg)
			require.Error(t, err)
			assert.Nil(t, sink)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

func TestWorkerInvalid(t *testing.T) {
	cfg, _, _ := consoles()
	blocker := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(blocker, nil, 0o644))
	cfg.Dir = blocker // a file where the log directory should be
	sink, err := workerlog.New(cfg)
	require.NoError(t, err)
	_, err = sink.Worker(0, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), blocker)

	cfg.Dir = ""
	sink, err = workerlog.New(cfg)
	require.NoError(t, err)
	w, err := sink.Worker(1, 0)
	require.NoError(t, err)
	defer w.Close()
	_, err = sink.Worker(1, 1)
	assert.ErrorContains(t, err, "rank 1 already has a Worker")
	_, err = sink.Worker(-1, 0)
	assert.ErrorContains(t, err, "negative rank")
	_, err = sink.Worker(2, -1)
	assert.ErrorContains(t, err, "negative rank")
}

// failingWriter fails every Write and counts them.
type failingWriter struct{ calls int }

func (f *failingWriter) Write([]byte) (int, error) {
	f.calls++
	return 0, errors.New("console gone")
}

// A broken console must not stop the worker's output from being drained or written to files.
func TestConsoleError(t *testing.T) {
	cfg, _, _ := consoles()
	console := &failingWriter{}
	cfg.Stdout = console
	cfg.Dir = t.TempDir()
	w := newWorker(t, cfg, 0, 0)
	write(t, w.Stdout(), "a\n", "b\n", "c")
	err := w.Close()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "console gone")
	assert.Equal(t, 1, console.calls, "a failed console is dropped from the stream")
	data, rerr := os.ReadFile(filepath.Join(w.Dir(), "stdout.log"))
	require.NoError(t, rerr)
	assert.Equal(t, "a\nb\nc", string(data))
}

func TestClose(t *testing.T) {
	cfg, stdout, _ := consoles()
	w := newWorker(t, cfg, 0, 0)
	write(t, w.Stdout(), "tail")
	require.NoError(t, w.Close())
	require.NoError(t, w.Close(), "a second Close")
	_, err := w.Stdout().Write([]byte("late\n"))
	assert.ErrorIs(t, err, os.ErrClosed)
	_, err = w.Stderr().Write([]byte("late\n"))
	assert.ErrorIs(t, err, os.ErrClosed)
	assert.Equal(t, "[h:0] tail\n", stdout.String())
}

// Worker writers work as the output of a real process (os/exec copies from a pipe into them).
func TestRealProcess(t *testing.T) {
	cfg, stdout, stderr := consoles()
	cfg.Dir = t.TempDir()
	w := newWorker(t, cfg, 7, 0)
	cmd := exec.Command("/bin/sh", "-c", `echo one; echo two >&2; printf three`)
	cmd.Stdout, cmd.Stderr = w.Stdout(), w.Stderr()
	require.NoError(t, cmd.Run())
	require.NoError(t, w.Close())
	assert.Equal(t, "[h:7] one\n[h:7] three\n", stdout.String())
	assert.Equal(t, "[h:7] two\n", stderr.String())
	assert.Equal(t, []string{"two"}, w.Tail())
}
