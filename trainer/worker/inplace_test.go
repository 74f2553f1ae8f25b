package worker

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/heartbeat"
	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/trainer/config"
)

// freePort is a TCP port free on the loopback interface now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// rankRun is one worker of a test world, run by Run in this process
// with a real agent channel.
type rankRun struct {
	pipe   *heartbeat.Pipe
	stdout *lines
	cancel context.CancelCauseFunc
	done   chan error
}

// round is the contract of rank of size ranks on one node, in round n,
// with its store at port.
func round(rank, size, n, port int) distenv.Worker {
	return distenv.Worker{Rank: rank, LocalRank: rank, WorldSize: size, LocalWorldSize: size, GroupWorldSize: 1,
		MasterAddr: "127.0.0.1", MasterPort: port, RestartCount: n, RunID: "inplace"}
}

// startRank runs w's worker as an agent would start it: its contract in
// the environment, and the worker's end of a channel as its own
// descriptor.
func startRank(t *testing.T, cfg config.Config, w distenv.Worker, secret string) *rankRun {
	t.Helper()
	p, err := heartbeat.NewPipe()
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	// The worker's own descriptor, as if inherited; Run's channel owns it
	// (and, as a process's exit would, the garbage collector closes it).
	fd, err := unix.Dup(int(p.WorkerEnd().Fd()))
	require.NoError(t, err)
	require.NoError(t, p.CloseWorkerEnd())
	p.Ready() // starts reading the worker's lines
	env := []string{
		fmt.Sprintf("RANK=%d", w.Rank), fmt.Sprintf("LOCAL_RANK=%d", w.LocalRank), fmt.Sprintf("WORLD_SIZE=%d", w.WorldSize),
		fmt.Sprintf("LOCAL_WORLD_SIZE=%d", w.LocalWorldSize), "GROUP_RANK=0", "GROUP_WORLD_SIZE=1",
		"MASTER_ADDR=" + w.MasterAddr, fmt.Sprintf("MASTER_PORT=%d", w.MasterPort), "TORCHELASTIC_RUN_ID=" + w.RunID,
		fmt.Sprintf("%s=%d", heartbeat.EnvVar, fd), jobsecret.EnvVar + "=" + secret,
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	r := &rankRun{pipe: p, stdout: newLines(""), cancel: cancel, done: make(chan error, 1)}
	go func() {
		r.done <- Run(ctx, Options{Config: cfg, LookupEnv: envOf(env...), Threads: 1, Stdout: r.stdout})
	}()
	t.Cleanup(func() { cancel(nil) })
	return r
}

// waitStep waits until every rank reported a step past after; a rank
// whose Run returned meanwhile fails the test.
func waitStep(t *testing.T, after int, ranks ...*rankRun) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for i := 0; i < len(ranks); {
		select {
		case err := <-ranks[i].done:
			t.Fatalf("rank %d returned before step %d: %v", i, after+1, err)
		case <-time.After(time.Millisecond):
		}
		switch {
		case ranks[i].pipe.LastStep() > after:
			i++
		case time.Now().After(deadline):
			t.Fatalf("rank %d: no step past %d within a minute", i, after)
		}
	}
}

// result waits for r's Run to return.
func (r *rankRun) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		return err
	case <-time.After(2 * time.Minute):
		t.Fatal("the worker did not end within 2 minutes")
		return nil
	}
}

func testSecret(t *testing.T) string {
	t.Helper()
	s, err := jobsecret.New()
	require.NoError(t, err)
	return s.Encode()
}

// TestRunInPlace: workers under an agent go into the next round in
// place, without a restart: at a step boundary when the agent sends the
// round to a whole world, and after their world broke when a peer is
// gone.
func TestRunInPlace(t *testing.T) {
	catchSignals(t)
	t.Run("a round at a step boundary", func(t *testing.T) {
		cfg := tinyConfig(t, "parallel.mode=ddp", "train.steps=300", "train.log_every=100")
		secret, port := testSecret(t), freePort(t)
		ranks := []*rankRun{startRank(t, cfg, round(0, 2, 0, port), secret), startRank(t, cfg, round(1, 2, 0, port), secret)}
		waitStep(t, 1, ranks...)
		next := freePort(t)
		for i, r := range ranks {
			require.NoError(t, r.pipe.SendRound(round(i, 2, 1, next), true))
		}
		for _, r := range ranks {
			require.NoError(t, r.result(t))
		}
		out := ranks[0].stdout.String()
		require.Contains(t, out, "trainer: round 1: re-formed in place at world size 2: state of step ")
		require.Contains(t, out, "(0 bytes received here, 0 step(s) redone)")
		require.Contains(t, out, "trainer: done: 300 steps")
	})

	t.Run("a peer gone", func(t *testing.T) {
		cfg := tinyConfig(t, "parallel.mode=ddp", "train.steps=300", "train.log_every=100")
		secret, port := testSecret(t), freePort(t)
		survivor, lost := startRank(t, cfg, round(0, 2, 0, port), secret), startRank(t, cfg, round(1, 2, 0, port), secret)
		waitStep(t, 1, survivor, lost)
		lost.cancel(fmt.Errorf("node lost"))
		var xe *ExitError
		require.ErrorAs(t, lost.result(t), &xe)
		require.Equal(t, ExitFailed, xe.Code)
		require.Eventually(t, func() bool { _, ok := survivor.pipe.Awaiting(); return ok }, time.Minute, time.Millisecond,
			"the survivor awaits the next round")
		await, _ := survivor.pipe.Awaiting()
		require.Equal(t, 1, await.LostPeer)
		require.NoError(t, survivor.pipe.SendRound(round(0, 1, 1, freePort(t)), false))
		require.NoError(t, survivor.result(t))
		out := survivor.stdout.String()
		require.Contains(t, out, "trainer: round 1: re-formed in place at world size 1: state of step ")
		require.Contains(t, out, "trainer: done: ")
	})
}
