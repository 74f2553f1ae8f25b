package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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

	entry, err := etcdstore.Enter(ctx, client, "job", 0)
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
