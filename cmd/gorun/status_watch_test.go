package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// gorun status --watch into a pipe (not a terminal) prints the status as
// plain lines once, then again only when it changes, and stops cleanly on
// SIGINT: here over a real etcd, as an agent enters the run and its first
// round opens.
func TestStatusWatchPrintsChangesToAPipe(t *testing.T) {
	srv := etcdtest.Start(t)
	client := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	// await returns the lines up to the first that contains want.
	await := func(want string) []string {
		t.Helper()
		var seen []string
		for {
			select {
			case line, ok := <-lines:
				require.True(t, ok, "output ended before %q; saw %q", want, seen)
				seen = append(seen, line)
				if strings.Contains(line, want) {
					return seen
				}
			case <-ctx.Done():
				t.Fatalf("no %q in time; saw %q", want, seen)
			}
		}
	}

	app := NewApp()
	app.Writer, app.ErrWriter = w, w
	done := make(chan int, 1)
	go func() {
		done <- exitCode(app, app.RunContext(ctx, []string{"gorun", "status", "--watch", "--interval=10ms",
			"--rdzv-endpoint", strings.Join(srv.Endpoints(), ","), "--rdzv-id", "job"}))
	}()

	first := await("run job: no rendezvous on this etcd")
	require.Len(t, first, 2)
	require.Regexp(t, `^--- \d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`, first[0])

	entry, err := etcdstore.Enter(ctx, client, "job", etcdstore.Launch{})
	require.NoError(t, err)
	second := await("starting, no round yet")
	require.Len(t, second, 2, "only the change is printed: %q", second)

	state, err := json.Marshal(rendezvous.State{Round: 1, Phase: rendezvous.PhaseJoinable, Since: time.Now(),
		Limits: rendezvous.Limits{MinNodes: 1, MaxNodes: 2, MaxFailures: 3}})
	require.NoError(t, err)
	_, err = client.Put(ctx, entry.Prefix()+rendezvous.KeyState, string(state))
	require.NoError(t, err)
	third := await("round 1 joinable")
	require.Len(t, third, 2, "only the change is printed: %q", third)
	await("members: none yet (round 1 is joinable)")

	// The watch has printed, so it listens for SIGINT.
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGINT))
	select {
	case code := <-done:
		require.Equal(t, 0, code, "SIGINT is a clean stop")
	case <-ctx.Done():
		t.Fatal("gorun status --watch did not stop on SIGINT")
	}
	require.NoError(t, w.Close())
	var rest []string
	for line := range lines {
		rest = append(rest, line)
	}
	for _, line := range rest {
		require.NotContains(t, line, "--- ", "nothing changed after round 1 opened: %q", rest)
	}
}

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
	for strings.Count(screenful.String(), clearScreen) < 3 {
		select {
		case s := <-shown:
			screenful.WriteString(s)
		case <-ctx.Done():
			t.Fatalf("fewer than 3 redraws in time: %q", screenful.String())
		}
	}
	require.Contains(t, screenful.String(), clearScreen+"run job: no rendezvous on this etcd")
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
