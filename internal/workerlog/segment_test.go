package workerlog_test

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/workerlog"
)

func TestCarriageReturns(t *testing.T) {
	tests := []struct {
		name    string
		chunks  []string
		console string
		tail    []string
	}{
		{"progress ended by CR", []string{"10%\r", "20%\r", "done\n"}, "[h:3] 10%\r[h:3] 20%\r[h:3] done\n", []string{"done"}},
		{"tqdm: CR first", []string{"\r 10%", "\r 20%", "\n"}, "[h:3]  10%\r[h:3]  20%\n", []string{" 20%"}},
		{"CR LF in one write", []string{"a\r\n"}, "[h:3] a\r\n", []string{"a"}},
		{"CR LF across writes", []string{"a\r", "\n"}, "[h:3] a\r\n", []string{"a"}},
		{"overwritten line", []string{"abc\rde\n"}, "[h:3] abc\r[h:3] de\n", []string{"de"}},
		{"CR alone", []string{"\r\r"}, "", []string{}},
		{"open CR line ended at close", []string{"x\r"}, "[h:3] x\r\n", []string{"x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, _, stderr := consoles()
			w := newWorker(t, cfg, 3, 1)
			write(t, w.Stderr(), tt.chunks...)
			tail := w.Tail()
			require.NoError(t, w.Close())
			assert.Equal(t, tt.console, stderr.String())
			assert.Equal(t, tt.tail, tail)
		})
	}
}

// Lines of two workers never share a console line: an open one (after a
// carriage return) is ended before the other worker's line.
func TestCarriageReturnInterleaved(t *testing.T) {
	cfg, stdout, _ := consoles()
	sink, err := workerlog.New(cfg)
	require.NoError(t, err)
	w1, err := sink.Worker(1, 1)
	require.NoError(t, err)
	w2, err := sink.Worker(2, 2)
	require.NoError(t, err)
	write(t, w1.Stdout(), "a 10%\r")
	write(t, w2.Stdout(), "b\n")
	write(t, w1.Stdout(), "a 20%\r")
	write(t, w1.Stdout(), "\n")
	require.NoError(t, w1.Close())
	require.NoError(t, w2.Close())
	assert.Equal(t, "[h:1] a 10%\r\n[h:2] b\n[h:1] a 20%\r\n", stdout.String())
}

// eventWriter is a console that tells of each Write on a channel.
type eventWriter struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	writes chan string
}

func (e *eventWriter) Write(p []byte) (int, error) {
	e.mu.Lock()
	e.buf.Write(p)
	e.mu.Unlock()
	e.writes <- string(p)
	return len(p), nil
}

func (e *eventWriter) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.buf.String()
}

// An unfinished line is shown after FlushAfter with no further output; its
// rest continues the same console line, unless another worker wrote in
// between.
func TestPartialLineFlushed(t *testing.T) {
	console := &eventWriter{writes: make(chan string, 16)}
	sink, err := workerlog.New(workerlog.Config{Host: "h", Stdout: console, FlushAfter: time.Millisecond})
	require.NoError(t, err)
	w0, err := sink.Worker(0, 0)
	require.NoError(t, err)
	w1, err := sink.Worker(1, 1)
	require.NoError(t, err)

	write(t, w0.Stdout(), "Password: ")
	assert.Equal(t, "[h:0] Password: ", <-console.writes, "shown without a newline")
	write(t, w0.Stdout(), "ok\n")
	assert.Equal(t, "ok\n", <-console.writes, "the rest continues the line")

	write(t, w0.Stdout(), "x")
	assert.Equal(t, "[h:0] x", <-console.writes)
	write(t, w1.Stdout(), "y\n")
	assert.Equal(t, "\n[h:1] y\n", <-console.writes, "the other worker's line starts a new one")
	write(t, w0.Stdout(), "z\n")
	assert.Equal(t, "[h:0] z\n", <-console.writes, "the rest goes on a new line, prefixed")

	write(t, w1.Stdout(), "end")
	assert.Equal(t, "[h:1] end", <-console.writes)
	require.NoError(t, w0.Close())
	require.NoError(t, w1.Close())
	assert.Equal(t, "\n", <-console.writes, "close ends the open line")
	assert.Equal(t, "[h:0] Password: ok\n[h:0] x\n[h:1] y\n[h:0] z\n[h:1] end\n", console.String())
}

func TestExpandPrefix(t *testing.T) {
	vars := workerlog.PrefixVars{Rank: 12, LocalRank: 4, RoleName: "trainer", Hostname: "n7"}
	tests := []struct{ template, want string }{
		{"[${role_name}${local_rank}]: ", "[trainer4]: "},
		{"$rank|", "12|"},
		{"${rank}${local_rank}", "124"},
		{"[$hostname:$rank] ", "[n7:12] "},
		{"$$rank", "$rank"},
		{"${nope} $nope", "${nope} $nope"},
		{"$ $", "$ $"},
		{"${rank", "${rank"},
		{"$ranks", "$ranks"},
		{"${1}", "${1}"},
		{"", ""},
		{"plain", "plain"},
	}
	for _, tt := range tests {
		t.Run(tt.template, func(t *testing.T) {
			assert.Equal(t, tt.want, workerlog.ExpandPrefix(tt.template, vars))
		})
	}
}

func TestPrefixTemplate(t *testing.T) {
	for _, tt := range []struct {
		name     string
		template *string
		want     string
	}{
		{"default", nil, "[h:5] a\n"},
		{"off", ptr(""), "a\n"},
		{"torchrun tee style", ptr("[${role_name}${local_rank}]:"), "[trainer1]:a\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, stdout, _ := consoles()
			cfg.Role, cfg.PrefixTemplate = "trainer", tt.template
			w := newWorker(t, cfg, 5, 1)
			write(t, w.Stdout(), "a\n")
			require.NoError(t, w.Close())
			assert.Equal(t, tt.want, stdout.String())
		})
	}
}

func ptr[T any](v T) *T { return &v }
