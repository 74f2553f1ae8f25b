package heartbeat

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/distenv"
)

func TestParseAwait(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Await
		ok   bool
		err  string
	}{
		{line: "await 41 peer=5\n", want: Await{Step: 41, LostPeer: 5}, ok: true},
		{line: "await 41", want: Await{Step: 41, LostPeer: -1}, ok: true},
		{line: "await 0 peer=-1 later=1", want: Await{Step: 0, LostPeer: -1}, ok: true},
		{line: "41 loss=2", ok: false},
		{line: "await", ok: true, err: "no step"},
		{line: "await x", ok: true, err: "step"},
		{line: "await 3 peer=y", ok: true, err: "peer"},
	} {
		t.Run(tc.line, func(t *testing.T) {
			got, ok, err := ParseAwait(tc.line)
			require.Equal(t, tc.ok, ok)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	_, err := ParseLine(Await{Step: 3, LostPeer: 1}.Line())
	require.Error(t, err, "an agent that knows only progress skips await lines")
}

func TestParseSilent(t *testing.T) {
	for _, tc := range []struct {
		line string
		peer int
		ok   bool
		err  string
	}{
		{line: SilentLine(5), peer: 5, ok: true},
		{line: "silent peer=0", peer: 0, ok: true},
		{line: "41 loss=2", ok: false},
		{line: "await 41 peer=5", ok: false},
		{line: "silent", ok: true, err: "want"},
		{line: "silent 5", ok: true, err: "want"},
		{line: "silent peer=-1", ok: true, err: "not a rank"},
		{line: "silent peer=x", ok: true, err: "not a rank"},
	} {
		t.Run(tc.line, func(t *testing.T) {
			peer, ok, err := ParseSilent(tc.line)
			require.Equal(t, tc.ok, ok)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.peer, peer)
		})
	}
}

func TestRoundLineRoundTrips(t *testing.T) {
	w := distenv.Worker{Rank: 3, LocalRank: 1, WorldSize: 4, LocalWorldSize: 2, GroupRank: 1, GroupWorldSize: 2,
		MasterAddr: "10.0.0.1", MasterPort: 29500, RestartCount: 2, RunID: "job", ErrorFile: "/e/attempt_2/3/error.json"}
	line, err := RoundLine(w)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "round {"))
	got, ok, err := ParseRound(line)
	require.True(t, ok)
	require.NoError(t, err)
	require.Equal(t, w, got)

	_, ok, _ = ParseRound("12 loss=1")
	require.False(t, ok)
	_, ok, err = ParseRound("round {bad")
	require.True(t, ok)
	require.Error(t, err)
	_, err = ParseLine(line)
	require.Error(t, err, "a round line is not progress")
}

// inProcess is a Pipe whose worker end is used by a Beater of this
// process, as a worker's FromEnv makes it.
func inProcess(t *testing.T) (*Pipe, *Beater) {
	t.Helper()
	p, err := NewPipe()
	require.NoError(t, err)
	fd, err := unix.Dup(int(p.WorkerEnd().Fd()))
	require.NoError(t, err)
	require.NoError(t, p.CloseWorkerEnd())
	b := beaterOn(fd)
	t.Cleanup(func() {
		_ = b.f.Close()
		_ = p.Close()
	})
	return p, b
}

// The channel both ways in one process: progress and an await reach the
// agent, a round reaches the worker; Rounds ends with its context.
func TestChannelRoundTrip(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after inProcess's cleanup
	p, b := inProcess(t)
	awaits := make(chan Await, 1)
	p.OnAwait(func(a Await) { awaits <- a })
	silent := make(chan int, 1)
	p.OnSilent(func(peer int) { silent <- peer })
	ctx, cancel := context.WithCancel(context.Background())
	stalls := p.Watch(ctx, 0)
	rounds := b.Rounds(ctx)

	b.Beat(7)
	b.Silent(4)
	require.Equal(t, 4, <-silent)
	_, awaiting := p.Awaiting()
	require.False(t, awaiting, "a silent peer is no broken world")
	b.Await(7, 2)
	got := <-awaits
	require.False(t, got.At.IsZero(), "the agent stamps when it received the await")
	got.At = time.Time{}
	require.Equal(t, Await{Step: 7, LostPeer: 2}, got)
	a, ok := p.Awaiting()
	require.True(t, ok)
	require.Equal(t, 7, a.Step)
	require.Equal(t, 7, p.LastStep())

	w := distenv.Worker{Rank: 1, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 1, RestartCount: 1}
	require.NoError(t, p.SendRound(w, false))
	require.Equal(t, w, (<-rounds).Worker)

	cancel()
	_, open := <-rounds
	require.False(t, open, "Rounds closes when its context ends")
	_, stalled := <-stalls
	require.False(t, stalled)
}

// A hot spare's ready line closes Ready (which starts reading the
// channel by itself, before any Watch) and is no progress and no await.
func TestReady(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after inProcess's cleanup
	p, b := inProcess(t)
	ready := p.Ready()
	select {
	case <-ready:
		t.Fatal("ready before the worker said so")
	default:
	}
	b.Ready()
	b.Ready() // a second one changes nothing
	<-ready
	require.Equal(t, -1, p.LastStep(), "a ready line is no progress")
	_, awaiting := p.Awaiting()
	require.False(t, awaiting, "a ready line is no await")
	require.NoError(t, b.Close())
	<-p.Done()
}

// A worker's last lines (a requeue line, then its exit) are handled once
// Drain returns, whether a reader already follows the channel or not:
// the agent knows what the worker said before it acts on its exit. A line
// longer than maxLine costs none of the lines after it.
func TestDrainHandlesWhatTheWorkerSaidLast(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after inProcess's cleanup
	for _, reading := range []bool{false, true} {
		t.Run(fmt.Sprintf("reader running %v", reading), func(t *testing.T) {
			p, b := inProcess(t)
			if reading {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				p.Watch(ctx, 0)
			}
			for step := range 100 {
				b.Beat(step)
			}
			_, err := b.f.WriteString(strings.Repeat("x", maxLine+1) + "\n")
			require.NoError(t, err)
			require.False(t, p.Requeued(), "no requeue line yet")
			b.Requeue()
			p.Drain()
			require.True(t, p.Requeued(), "Drain returned before the requeue line was handled")
			require.Equal(t, 99, p.LastStep())
			require.NoError(t, b.Close())
			p.Drain() // nothing more, end of file: returns at once
		})
	}
}

func TestNilBeater(t *testing.T) {
	var b *Beater
	b.Beat(1)
	b.Await(1, 0)
	b.Silent(0)
	b.Ready()
	b.Requeue()
	require.Nil(t, b.Rounds(context.Background()))
	require.Nil(t, FromEnv(func(string) (string, bool) { return "", false }))
}

// A real child process speaks the channel on its fd 3 with plain shell
// redirections: progress, an await, then it reads its round and reports
// progress again. While it awaits it is not judged hung; its next
// progress line starts the judgement again.
func TestChannelWithChildProcess(t *testing.T) {
	defer goleak.VerifyNone(t)
	got := filepath.Join(t.TempDir(), "round")
	p, err := NewPipe()
	require.NoError(t, err)
	defer p.Close()
	cmd := exec.Command("sh", "-c", `echo 1 >&3; echo "await 1 peer=2" >&3; read -r l <&3; echo "$l" > "$OUT"; echo 2 >&3; read -r l <&3; exit 0`)
	cmd.Env = append(os.Environ(), "OUT="+got)
	cmd.ExtraFiles = []*os.File{p.WorkerEnd()}
	require.NoError(t, cmd.Start())
	require.NoError(t, p.CloseWorkerEnd())

	var beats []int
	p.OnBeat(func(prog Progress) { beats = append(beats, prog.Step) })
	awaits := make(chan Await, 1)
	p.OnAwait(func(a Await) { awaits <- a })
	const timeout = 50 * time.Millisecond
	stalls := p.Watch(context.Background(), timeout)
	aw := <-awaits
	aw.At = time.Time{}
	require.Equal(t, Await{Step: 1, LostPeer: 2}, aw)

	// A wrong timer would fire now: give it the chance before the round.
	time.Sleep(3 * timeout)
	select {
	case s := <-stalls:
		t.Fatalf("judged hung while awaiting a round: %s", s)
	default:
	}
	w := distenv.Worker{Rank: 0, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 2, RestartCount: 1}
	require.NoError(t, p.SendRound(w, false))
	stall, ok := <-stalls
	require.True(t, ok, "the progress after the round restarts the judgement")
	require.Equal(t, 2, stall.LastStep)
	require.Equal(t, []int{1, 2}, beats)

	data, err := os.ReadFile(got)
	require.NoError(t, err)
	sent, ok, err := ParseRound(string(data))
	require.True(t, ok)
	require.NoError(t, err)
	require.Equal(t, w, sent)

	require.NoError(t, p.Close(), "the worker reads end of file and exits")
	require.NoError(t, cmd.Wait())
}

// TestExecLine pins the exec line that python/gorun/_warm.py parses
// (python/tests/test_warm.py sends the same).
func TestExecLine(t *testing.T) {
	line, err := ExecLine([]string{"RANK=3", "X=a b=c", "EMPTY="})
	require.NoError(t, err)
	require.Equal(t, `exec {"env":["RANK=3","X=a b=c","EMPTY="]}`+"\n", line)
	_, err = ParseLine(line)
	require.Error(t, err, "an exec line is not progress")
}
