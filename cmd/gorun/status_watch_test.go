package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/internal/straggler"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
	"github.com/gorun/gorun/rendezvous/status"
)

// gorun status --watch into a pipe (not a terminal) prints the status as
// plain lines once, then again only when it changes, and stops cleanly on
// SIGINT: here over a real etcd, as an agent enters the run and its first
// round opens.
// pipeWatch is gorun status --watch --interval=10ms of run "job" on srv, writing into a pipe
// (not a terminal), read line by line by the test.
type pipeWatch struct {
	t     *testing.T
	ctx   context.Context
	w     *os.File
	lines chan string
	done  chan int
}

// startPipeWatch starts gorun status --watch into a pipe; ctx bounds it.
func startPipeWatch(ctx context.Context, t *testing.T, srv *etcdtest.Server) *pipeWatch {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	p := &pipeWatch{t: t, ctx: ctx, w: w, lines: make(chan string), done: make(chan int, 1)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	app := NewApp()
	app.Writer, app.ErrWriter = w, w
	go func() {
		p.done <- exitCode(app, app.RunContext(ctx, []string{"gorun", "status", "--watch", "--interval=10ms",
			"--rdzv-endpoint", strings.Join(srv.Endpoints(), ","), "--rdzv-id", "job"}))
	}()
	return p
}

// await returns the lines printed up to the first that contains want.
func (p *pipeWatch) await(want string) []string {
	p.t.Helper()
	var seen []string
	for {
		select {
		case line, ok := <-p.lines:
			require.True(p.t, ok, "output ended before %q; saw %q", want, seen)
			seen = append(seen, line)
			if strings.Contains(line, want) {
				return seen
			}
		case <-p.ctx.Done():
			p.t.Fatalf("no %q in time; saw %q", want, seen)
		}
	}
}

// stop sends SIGINT (the watch has printed, so it listens for it), requires a clean exit and
// returns the lines printed after the last await.
func (p *pipeWatch) stop() []string {
	p.t.Helper()
	require.NoError(p.t, syscall.Kill(os.Getpid(), syscall.SIGINT))
	select {
	case code := <-p.done:
		require.Equal(p.t, 0, code, "SIGINT is a clean stop")
	case <-p.ctx.Done():
		p.t.Fatal("gorun status --watch did not stop on SIGINT")
	}
	require.NoError(p.t, p.w.Close())
	var rest []string
	for line := range p.lines {
		rest = append(rest, line)
	}
	return rest
}

// gorun status --watch into a pipe (not a terminal) prints the status as
// plain lines once, then again only when it changes, and stops cleanly on
// SIGINT: here over a real etcd, as an agent enters the run and its first
// round opens.
func TestStatusWatchPrintsChangesToAPipe(t *testing.T) {
	srv := etcdtest.Start(t)
	client := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	watch := startPipeWatch(ctx, t, srv)

	first := watch.await("run job: no rendezvous on this etcd")
	require.Len(t, first, 2)
	require.Regexp(t, `^--- \d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`, first[0])

	entry, err := etcdstore.NewConn(client).Enter(ctx, "job", etcdstore.Launch{})
	require.NoError(t, err)
	second := watch.await("starting, no round yet")
	require.Len(t, second, 2, "only the change is printed: %q", second)

	state, err := json.Marshal(rendezvous.State{Round: 1, Phase: rendezvous.PhaseJoinable, Since: time.Now(),
		Limits: rendezvous.Limits{MinNodes: 1, MaxNodes: 2, MaxFailures: 3}})
	require.NoError(t, err)
	_, err = client.Put(ctx, entry.Prefix()+rendezvous.KeyState, string(state))
	require.NoError(t, err)
	third := watch.await("round 1 joinable")
	require.Len(t, third, 2, "only the change is printed: %q", third)
	watch.await("members: none yet (round 1 is joinable)")

	rest := watch.stop()
	for _, line := range rest {
		require.NotContains(t, line, "--- ", "nothing changed after round 1 opened: %q", rest)
	}
}

// gorun status --watch shows each member's latest step, loss and tokens/s as its agent
// publishes them (the heartbeat figures a straggler.Tracker keeps, under the node's stats key),
// "-" for a member that published none, and prints again when they change: over a real etcd
// holding a running round of two nodes.
func TestStatusWatchShowsEachNodesProgress(t *testing.T) {
	srv := etcdtest.Start(t)
	client := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	entry, err := etcdstore.NewConn(client).Enter(ctx, "job", etcdstore.Launch{})
	require.NoError(t, err)
	put := func(key string, value []byte) {
		t.Helper()
		_, err := client.Put(ctx, entry.Prefix()+key, string(value))
		require.NoError(t, err)
	}
	now := time.Now()
	state, err := json.Marshal(rendezvous.State{Round: 1, Phase: rendezvous.PhaseRunning, Since: now, MasterAddr: "10.0.0.1", MasterPort: 29500,
		Limits: rendezvous.Limits{MinNodes: 1, MaxNodes: 2, MaxFailures: 3}})
	require.NoError(t, err)
	put(rendezvous.KeyState, state)
	roster, err := rendezvous.Roster{Round: 1, Members: []rendezvous.Member{
		{ID: "node-a.11", Host: "node-a", Addr: "10.0.0.1", NProc: 2, Since: now},
		{ID: "node-b.22", Host: "node-b", Addr: "10.0.0.2", NProc: 2, Since: now},
	}}.Encode()
	require.NoError(t, err)
	put(rendezvous.KeyRoster, roster)
	// Node a's agent, as it publishes its workers' heartbeats.
	tracker := straggler.NewTracker()
	tracker.Started(0, 0)
	tracker.Started(1, 1)
	tracker.Observe(0, 0, heartbeat.Progress{Step: 41, Loss: 2.5, TokensPerS: 1234.4, ComputeS: 0.2})
	tracker.Observe(1, 1, heartbeat.Progress{Step: 40, Loss: 2.75, TokensPerS: 1200, ComputeS: 0.2})
	put(rendezvous.PrefixStats+"node-a.11", tracker.Report("node-a").Encode())

	watch := startPipeWatch(ctx, t, srv)
	head := watch.await("NODE RANK")
	require.Regexp(t, `NODE RANK +HOST +ADDR +WORKERS +ALIVE +SINCE +STEP +LOSS +TOK/S$`, head[len(head)-1])
	require.Regexp(t, `^0 +node-a +10\.0\.0\.1 +2 +false +\S+ ago +41 +2\.500 +1234$`, lastOf(watch.await("node-a")))
	require.Regexp(t, `^1 +node-b +10\.0\.0\.2 +2 +false +\S+ ago +- +- +-$`, lastOf(watch.await("node-b")))

	tracker.Observe(1, 1, heartbeat.Progress{Step: 42, Loss: 2.25, TokensPerS: 1300, ComputeS: 0.2})
	put(rendezvous.PrefixStats+"node-a.11", tracker.Report("node-a").Encode())
	require.Regexp(t, ` 42 +2\.250 +1300$`, lastOf(watch.await("node-a")))
	other := straggler.NewTracker()
	other.Started(0, 2)
	other.Observe(0, 2, heartbeat.Progress{Step: 42, Loss: 2.375, TokensPerS: math.NaN(), ComputeS: 0.2})
	put(rendezvous.PrefixStats+"node-b.22", other.Report("node-b").Encode())
	watch.await("--- ") // the rest of the print before, up to the next one
	require.Regexp(t, ` 42 +2\.375 +-$`, lastOf(watch.await("node-b")))
	watch.stop()

	code, out, _ := run(t, nil, "status", "--json", "--rdzv-endpoint", strings.Join(srv.Endpoints(), ","), "--rdzv-id", "job")
	require.Equal(t, 0, code)
	var rep struct {
		Members []struct {
			Host     string                  `json:"host"`
			Progress *straggler.RankProgress `json:"progress"`
		} `json:"members"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Len(t, rep.Members, 2)
	require.Equal(t, &straggler.RankProgress{Rank: 1, Step: 42, Loss: 2.25, TokensPerS: 1300}, rep.Members[0].Progress)
	require.Equal(t, &straggler.RankProgress{Rank: 2, Step: 42, Loss: 2.375}, rep.Members[1].Progress)
}

func lastOf(lines []string) string { return lines[len(lines)-1] }

func TestStatusWatchBadFlags(t *testing.T) {
	base := []string{"status", "--watch", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-id", "job"}
	code, _, stderr := run(t, nil, append(base, "--interval=0s")...)
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "status: --interval 0s: must be above 0")
	code, _, stderr = run(t, nil, append(base, "--json")...)
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "--watch and --json do not go together")
}

// openPTY opens a pseudo-terminal pair: the terminal side gorun writes
// to, and the side the test reads what it shows from.
func openPTY(t *testing.T) (term, screen *os.File) {
	t.Helper()
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	screen = os.NewFile(uintptr(fd), "/dev/ptmx")
	t.Cleanup(func() { screen.Close() })
	require.NoError(t, unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0))
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	require.NoError(t, err)
	term, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { term.Close() })
	return term, screen
}

// On a terminal gorun status --watch clears the screen and redraws the
// status at every interval, changed or not, and stops on SIGTERM.
func TestStatusWatchRedrawsATerminal(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	term, screen := openPTY(t)
	require.True(t, isTerminal(term))
	shown := make(chan string)
	go func() {
		defer close(shown)
		buf := make([]byte, 4096)
		for {
			n, err := screen.Read(buf)
			if n > 0 {
				shown <- string(buf[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	app := NewApp()
	app.Writer, app.ErrWriter = term, term
	done := make(chan int, 1)
	go func() {
		done <- exitCode(app, app.RunContext(ctx, []string{"gorun", "status", "--watch", "--interval=10ms",
			"--rdzv-endpoint", strings.Join(srv.Endpoints(), ","), "--rdzv-id", "job"}))
	}()
	var screenful strings.Builder
	for strings.Count(screenful.String(), status.ClearScreen) < 3 {
		select {
		case s := <-shown:
			screenful.WriteString(s)
		case <-ctx.Done():
			t.Fatalf("fewer than 3 redraws in time: %q", screenful.String())
		}
	}
	require.Contains(t, screenful.String(), status.ClearScreen+"run job: no rendezvous on this etcd")
	require.Contains(t, screenful.String(), "every 10ms; Ctrl-C to stop")

	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGTERM))
	go func() {
		for range shown { // keep the terminal drained until the test ends
		}
	}()
	select {
	case code := <-done:
		require.Equal(t, 0, code, "SIGTERM is a clean stop")
	case <-ctx.Done():
		t.Fatal("gorun status --watch did not stop on SIGTERM")
	}
}
