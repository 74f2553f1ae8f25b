package replica

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gorun/gorun/internal/snapshot"
)

// deadline bounds every wait of these tests: none is expected to take a
// fraction of it; it only keeps a broken test from hanging.
const deadline = 30 * time.Second

// childEnv makes the test binary a pusher process (see runChild).
const childEnv = "GORUN_REPLICA_TEST_PUSHER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec))
	}
	goleak.VerifyTestMain(m)
}

// runChild pushes rank to peer until it is killed: spec is
// "round,dir,rank,peer"; the secret is testAuth's.
func runChild(spec string) int {
	f := strings.Split(spec, ",")
	round, _ := strconv.Atoi(f[0])
	rank, _ := strconv.Atoi(f[2])
	log := zerolog.New(os.Stderr)
	err := Push(log.WithContext(context.Background()), round, f[1], []int{rank}, []string{f[3]}, testAuth, nil)
	log.Error().Err(err).Msg("push returned")
	return 1
}

var testAuth = Auth{RunID: "job-1", Secret: []byte("the job secret, 32 bytes of it..")}

// lines is a log sink that tests can wait on.
type lines struct {
	mu   sync.Mutex
	all  []string
	more chan struct{} // closed and replaced at each line
}

func newLines() *lines { return &lines{more: make(chan struct{})} }

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, strings.TrimSpace(string(p)))
	close(l.more)
	l.more = make(chan struct{})
	return len(p), nil
}

// String returns the lines so far.
func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.all, "\n")
}

// count returns how many lines so far contain s.
func (l *lines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.all {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// wait returns the first line that contains s, once there is one.
func (l *lines) wait(t *testing.T, s string) string {
	t.Helper()
	timeout := time.After(deadline)
	for {
		l.mu.Lock()
		more := l.more
		for _, line := range l.all {
			if strings.Contains(line, s) {
				l.mu.Unlock()
				return line
			}
		}
		l.mu.Unlock()
		select {
		case <-more:
		case <-timeout:
			t.Fatalf("no log line with %q in:\n%s", s, l)
		}
	}
}

func (l *lines) logger() zerolog.Logger { return zerolog.New(l) }

// ended is how a push ended at the server.
type ended struct {
	rank int
	step uint64
	err  error
}

// node is a server with its directory, its log and its hooks' events.
type node struct {
	*Server
	dir   string
	log   *lines
	ended chan ended
}

// startNode serves a fresh directory; read, if not nil, is the
// payloadRead hook.
func startNode(t *testing.T, auth Auth, read func(rank int, step, n uint64)) *node {
	t.Helper()
	n := &node{dir: t.TempDir(), log: newLines(), ended: make(chan ended, 100)}
	s, err := serve("127.0.0.1:0", n.dir, auth, n.log.logger(), hooks{
		payloadRead: read,
		pushEnded:   func(rank int, step uint64, err error) { n.ended <- ended{rank, step, err} },
		// A small receive buffer, so that a pusher whose copy this server
		// stops reading (payloadRead blocks) is held in the middle of it.
		accepted: func(c net.Conn) { _ = c.(*net.TCPConn).SetReadBuffer(1 << 20) },
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	n.Server = s
	return n
}

// next returns how the next push ended at n.
func (n *node) next(t *testing.T) ended {
	t.Helper()
	select {
	case e := <-n.ended:
		return e
	case <-time.After(deadline):
		t.Fatal("no push ended")
		return ended{}
	}
}

// sender is a node's ranks' slots as its workers write them.
type sender struct {
	dir   string
	slots map[int]*snapshot.RankSlots
}

// newSender's slots are in dir.
func newSender(t testing.TB, dir string) *sender {
	s := &sender{dir: dir, slots: map[int]*snapshot.RankSlots{}}
	t.Cleanup(func() {
		for _, rs := range s.slots {
			rs.Close()
		}
	})
	return s
}

// save writes rank's snapshot of step (its own, sharded), size random
// bytes, with the workers' protocol, and returns its payload.
func (s *sender) save(t testing.TB, rank int, step uint64, size int) []byte {
	t.Helper()
	return s.write(t, snapshot.Header{Step: step, Length: uint64(size), Rank: rank, World: 4})
}

// write writes the snapshot of header h, h.Length random bytes, into
// h.Rank's slots with the workers' protocol, and returns its payload.
func (s *sender) write(t testing.TB, h snapshot.Header) []byte {
	t.Helper()
	rank := h.Rank
	rs := s.slots[rank]
	if rs == nil {
		var err error
		rs, err = snapshot.OpenRank(s.dir, rank)
		require.NoError(t, err)
		s.slots[rank] = rs
	}
	payload := make([]byte, h.Length)
	_, _ = rand.Read(payload)
	require.NoError(t, rs.Write(h, bytes.NewReader(payload)))
	return payload
}

// pushing runs Push in the background until the test ends; its log goes
// to the returned lines, its sent copies to the channel.
func pushing(t *testing.T, round int, dir string, ranks []int, peers []string, auth Auth) (*lines, chan ended) {
	t.Helper()
	log := newLines()
	sent := make(chan ended, 100)
	ctx, cancel := context.WithCancel(log.logger().WithContext(context.Background()))
	done := make(chan error, 1)
	go func() {
		done <- Push(ctx, round, dir, ranks, peers, auth, func(rank int, step uint64, peer string) {
			sent <- ended{rank: rank, step: step}
		})
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return log, sent
}

func waitSent(t *testing.T, sent chan ended, rank int, step uint64) {
	t.Helper()
	for {
		select {
		case e := <-sent:
			if e.rank == rank && e.step == step {
				return
			}
		case <-time.After(deadline):
			t.Fatalf("rank %d step %d was not sent", rank, step)
		}
	}
}

// requireHolds checks that dir holds exactly rank's step, complete, with
// payload.
func requireHolds(t *testing.T, dir string, rank int, step uint64, payload []byte) {
	t.Helper()
	held, err := snapshot.Scan(dir)
	require.NoError(t, err)
	require.Len(t, held, 1, "complete slots in %s: %v", dir, held)
	require.Equal(t, []snapshot.Holding{{Rank: rank, World: 4, Step: step, Path: held[0].Path}}, held)
	s, err := snapshot.Verify(held[0].Path)
	require.NoError(t, err)
	got, err := snapshot.ReadPayload(s)
	require.NoError(t, err)
	require.True(t, bytes.Equal(payload, got), "the payload of rank %d step %d differs", rank, step)
}

// TestPushReachesPeer: each new step of a rank reaches the peer, where it
// verifies, and replaces the copy before.
func TestPushReachesPeer(t *testing.T) {
	peer := startNode(t, testAuth, nil)
	peer.Accept(3, []int{0, 1})
	src := newSender(t, t.TempDir())
	one := src.save(t, 2, 1, 1<<20)
	_, sent := pushing(t, 3, src.dir, []int{2}, []string{peer.Addr()}, testAuth)
	waitSent(t, sent, 2, 1)
	requireHolds(t, peer.dir, 2, 1, one)

	two := src.save(t, 2, 2, 1<<20+7)
	waitSent(t, sent, 2, 2)
	held, err := snapshot.Scan(peer.dir)
	require.NoError(t, err)
	require.Len(t, held, 2, "steps 1 and 2, one in each slot")
	paths := snapshot.Paths(peer.dir, 2)
	s, err := snapshot.Newest(paths[:]...)
	require.NoError(t, err)
	require.Equal(t, uint64(2), s.Step)
	got, err := snapshot.ReadPayload(s)
	require.NoError(t, err)
	require.True(t, bytes.Equal(two, got))
}

// TestPushAfterRestoreAtAnOlderStep: a rank's slots hold a stale step 90
// in one slot (the job restored an older step, and nothing discarded it);
// the worker's new steps 5, 6, 7 go to the other slot, and reach the peer:
// each, when the test waits for each, and the newest at least when they
// are saved back to back.
func TestPushAfterRestoreAtAnOlderStep(t *testing.T) {
	tests := []struct {
		name string
		each bool // wait for each new step to be sent before the next save
	}{
		{name: "a step per poll", each: true},
		{name: "three saves back to back"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			peer := startNode(t, testAuth, nil)
			peer.Accept(0, nil)
			src := newSender(t, t.TempDir())
			src.save(t, 0, 90, 1000) // slot 0
			_, sent := pushing(t, 0, src.dir, []int{0}, []string{peer.Addr()}, testAuth)
			waitSent(t, sent, 0, 90)
			var last []byte
			for step := uint64(5); step <= 7; step++ {
				last = src.save(t, 0, step, 1000+int(step)) // slot 1: the lower step's
				if tt.each || step == 7 {
					waitSent(t, sent, 0, step)
				}
			}
			held, err := snapshot.Scan(peer.dir)
			require.NoError(t, err)
			require.Len(t, held, 2, "the stale step and the newest: %v", held)
			require.Equal(t, []uint64{7, 90}, []uint64{held[0].Step, held[1].Step})
			s, err := snapshot.Verify(held[0].Path)
			require.NoError(t, err)
			got, err := snapshot.ReadPayload(s)
			require.NoError(t, err)
			require.True(t, bytes.Equal(last, got), "the payload of step 7 differs")
		})
	}
}

// TestReplicatedNotSent: a replicated snapshot (the same state on every
// rank) is not copied, since every node holds it; a sharded one is. The
// replicated rank is polled first in each pass, so once the sharded step
// is sent the replicated one has been seen.
func TestReplicatedNotSent(t *testing.T) {
	peer := startNode(t, testAuth, nil)
	peer.Accept(0, nil)
	src := newSender(t, t.TempDir())
	src.write(t, snapshot.Header{Step: 1, Length: 1000, Rank: 1, World: 4, Flags: snapshot.FlagReplicated})
	own := src.save(t, 0, 1, 1000)
	_, sent := pushing(t, 0, src.dir, []int{1, 0}, []string{peer.Addr()}, testAuth)
	waitSent(t, sent, 0, 1)
	requireHolds(t, peer.dir, 0, 1, own)
	select {
	case e := <-sent:
		t.Fatalf("rank %d step %d was sent; want rank 1's replicated snapshot kept at home", e.rank, e.step)
	default:
	}
}

// TestHandshake: a wrong secret is refused by both ends (the dialer finds
// the listener's proof wrong, the listener the dialer's), another run's
// agent is refused, no secret on both ends works, and a push with a wrong
// secret is logged by the pusher.
func TestHandshake(t *testing.T) {
	tests := []struct {
		name       string
		server     Auth
		client     Auth
		wantErr    string // "" : the handshake passes (the fetch finds nothing)
		wantServer string // in the server's log
	}{
		{name: "same secret", server: testAuth, client: testAuth},
		{name: "no secret on both ends", server: Auth{RunID: "r"}, client: Auth{RunID: "r"}},
		{name: "wrong secret", server: testAuth, client: Auth{RunID: testAuth.RunID, Secret: []byte("another secret")},
			wantErr: "its proof is wrong", wantServer: "refused a connection: a fetch: " + ErrAuth.Error()},
		{name: "a secret against none", server: Auth{RunID: testAuth.RunID}, client: testAuth,
			wantErr: "its proof is wrong", wantServer: "refused a connection: a fetch: " + ErrAuth.Error()},
		{name: "another run", server: testAuth, client: Auth{RunID: "job-2", Secret: testAuth.Secret},
			wantErr: "another run", wantServer: "refused a connection: a fetch of another run"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			peer := startNode(t, tt.server, nil)
			dst, err := snapshot.OpenRank(t.TempDir(), 0)
			require.NoError(t, err)
			defer dst.Close()
			err = Fetch(context.Background(), peer.Addr(), tt.client, 0, 1, dst)
			if tt.wantErr == "" {
				require.ErrorIs(t, err, ErrNotFound)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
			if strings.Contains(tt.wantErr, "proof") {
				require.ErrorIs(t, err, ErrAuth)
			}
			// The server logs before it tells the dialer: the line is there.
			require.Equal(t, 1, peer.log.count(tt.wantServer), "server log: %v", peer.log)
		})
	}
	t.Run("push", func(t *testing.T) {
		peer := startNode(t, testAuth, nil)
		peer.Accept(0, nil)
		src := newSender(t, t.TempDir())
		src.save(t, 0, 1, 100)
		log, _ := pushing(t, 0, src.dir, []int{0}, []string{peer.Addr()}, Auth{RunID: testAuth.RunID})
		line := log.wait(t, "do not get through")
		require.Contains(t, line, "its proof is wrong")
		peer.log.wait(t, "refused a connection: a push: "+ErrAuth.Error())
	})
}

// TestStaleRoundRefused: a server in round 2 refuses the pushes of an
// agent still in round 1 and writes nothing; the pusher logs the refusal
// once, not at every step.
func TestStaleRoundRefused(t *testing.T) {
	peer := startNode(t, testAuth, nil)
	peer.Accept(2, nil)
	src := newSender(t, t.TempDir())
	src.save(t, 3, 1, 1000)
	log, _ := pushing(t, 1, src.dir, []int{3}, []string{peer.Addr()}, testAuth)
	for step := uint64(1); step <= 3; step++ {
		e := peer.next(t)
		require.Equal(t, 3, e.rank)
		require.Equal(t, step, e.step)
		require.ErrorContains(t, e.err, "a push of round 1: this agent is in round 2")
		if step < 3 {
			src.save(t, 3, step+1, 1000)
		}
	}
	// The pusher asked about step 3 after it had handled the refusals of
	// steps 1 and 2: what it logged of them is in.
	require.Equal(t, 1, log.count("do not get through"), "%v", log)
	require.Equal(t, 1, log.count("this agent is in round 2"), "%v", log)
	held, err := snapshot.Scan(peer.dir)
	require.NoError(t, err)
	require.Empty(t, held)
}

func TestAdmit(t *testing.T) {
	tests := []struct {
		name        string
		round       int
		own         []int
		push, rank  int
		wantRefusal string // "": admitted
	}{
		{name: "the round, another node's rank", round: 3, own: []int{0, 1}, push: 3, rank: 2},
		{name: "between rounds", round: -1, push: 3, rank: 2, wantRefusal: "accepts none now"},
		{name: "any negative round is none", round: -7, push: 0, rank: 2, wantRefusal: "accepts none now"},
		{name: "a stale round", round: 3, push: 2, rank: 2, wantRefusal: "a push of round 2: this agent is in round 3"},
		{name: "a later round", round: 3, push: 4, rank: 2, wantRefusal: "a push of round 4: this agent is in round 3"},
		{name: "its own rank", round: 3, own: []int{0, 1}, push: 3, rank: 1, wantRefusal: "rank 1 is one of this agent's own"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := newAcceptance(tt.round, tt.own).admit(tt.push, tt.rank)
			if tt.wantRefusal == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantRefusal)
		})
	}
}

// midway blocks the first payloadRead of rank at step: it closes reached,
// then waits for release, which the test calls (also deferred, so that a
// failed test does not leave the server's Close waiting for it).
func midway(rank int, step uint64) (hook func(int, uint64, uint64), reached chan struct{}, release func()) {
	reached, released := make(chan struct{}), make(chan struct{})
	var once, unblock sync.Once
	hook = func(r int, s, _ uint64) {
		if r == rank && s == step {
			once.Do(func() {
				close(reached)
				<-released
			})
		}
	}
	return hook, reached, func() { unblock.Do(func() { close(released) }) }
}

// bigSlot is a payload much larger than the socket buffers between a
// pusher and a node (the pusher's send buffer, at most
// net.ipv4.tcp_wmem's 4 MiB by default, and startNode's 1 MiB receive
// buffer, which the kernel doubles): a pusher whose peer stops reading is
// held in the middle of it.
const bigSlot = 32 << 20

// TestOverwrittenMidSend: the worker overwrites the slot being sent (two
// saves later); the sender drops that copy, the receiver writes no header
// for it, and the newer step gets there next.
func TestOverwrittenMidSend(t *testing.T) {
	hook, reached, release := midway(0, 1)
	peer := startNode(t, testAuth, hook)
	defer release()
	peer.Accept(1, nil)
	src := newSender(t, t.TempDir())
	src.save(t, 0, 1, bigSlot) // slot 0
	plog, sent := pushing(t, 1, src.dir, []int{0}, []string{peer.Addr()}, testAuth)
	<-reached
	src.save(t, 0, 2, bigSlot)          // slot 1
	three := src.save(t, 0, 3, bigSlot) // slot 0: the one being sent
	release()
	// The pusher may come back with step 3 before this end has read the
	// rest of step 1: "still being written", and it tries again.
	e := peer.next(t)
	for e.step == 3 && e.err != nil {
		require.ErrorContains(t, e.err, "still being written")
		e = peer.next(t)
	}
	require.Equal(t, uint64(1), e.step, "%v %v", e.err, plog)
	require.ErrorIs(t, e.err, errDropped)
	require.Equal(t, 1, plog.count("dropped a copy"))
	waitSent(t, sent, 0, 3)
	// The dropped copy left no complete slot: step 3 is all there is.
	requireHolds(t, peer.dir, 0, 3, three)
}

// TestBusyRetried: a push the peer answers "busy" (a copy of the rank is
// still being written there) is sent again at a later poll, though the
// slot has not changed since.
func TestBusyRetried(t *testing.T) {
	hook, reached, release := midway(0, 1)
	peer := startNode(t, testAuth, hook)
	defer release()
	peer.Accept(1, nil)
	a, b := newSender(t, t.TempDir()), newSender(t, t.TempDir())
	a.save(t, 0, 1, 1000)
	pushing(t, 1, a.dir, []int{0}, []string{peer.Addr()}, testAuth)
	<-reached // a's copy of rank 0 is being written
	b.save(t, 0, 2, 1000)
	_, sent := pushing(t, 1, b.dir, []int{0}, []string{peer.Addr()}, testAuth)
	e := peer.next(t)
	require.Equal(t, uint64(2), e.step)
	require.ErrorContains(t, e.err, "still being written")
	release()
	for e.step != 2 || e.err != nil {
		if e.step == 2 {
			require.ErrorContains(t, e.err, "still being written")
		} else {
			require.NoError(t, e.err, "a's copy of step 1")
		}
		e = peer.next(t)
	}
	waitSent(t, sent, 0, 2)
}

// TestUnreachableRetried: a step that could not be sent (the peer closed
// the connection in the handshake) is sent once the peer can be reached,
// though the slot has not changed since.
func TestUnreachableRetried(t *testing.T) {
	var once sync.Once
	cut := make(chan struct{})
	s, err := serve("127.0.0.1:0", t.TempDir(), testAuth, zerolog.Nop(), hooks{accepted: func(c net.Conn) {
		once.Do(func() {
			c.Close()
			close(cut)
		})
	}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	s.Accept(0, nil)
	src := newSender(t, t.TempDir())
	src.save(t, 0, 1, 1000)
	log, sent := pushing(t, 0, src.dir, []int{0}, []string{s.Addr()}, testAuth)
	<-cut
	waitSent(t, sent, 0, 1)
	require.Equal(t, 1, log.count("do not get through"), "the failed handshake: %v", log)
}

// TestPeerKilledMidTransfer: a pusher process killed in the middle of a
// copy leaves the receiver's previous copy of the rank whole.
func TestPeerKilledMidTransfer(t *testing.T) {
	hook, reached, release := midway(1, 2)
	peer := startNode(t, testAuth, hook)
	defer release()
	peer.Accept(0, nil)
	src := newSender(t, t.TempDir())
	one := src.save(t, 1, 1, 1<<20)
	var out bytes.Buffer
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+strings.Join([]string{"0", src.dir, "1", peer.Addr()}, ","))
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	e := peer.next(t)
	require.NoError(t, e.err, "child: %s", &out)
	require.Equal(t, uint64(1), e.step)
	requireHolds(t, peer.dir, 1, 1, one)

	src.save(t, 1, 2, bigSlot)
	<-reached
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	err := cmd.Wait()
	killed = true
	require.ErrorContains(t, err, "signal: killed", "child: %s", &out)
	release()
	e = peer.next(t)
	require.Equal(t, uint64(2), e.step)
	require.Error(t, e.err)
	if !errors.Is(e.err, syscall.ECONNRESET) {
		require.ErrorIs(t, e.err, io.ErrUnexpectedEOF)
	}
	requireHolds(t, peer.dir, 1, 1, one)
}

// TestAcceptFences: Accept(-1, nil) cuts off a copy being written, returns
// once it ended, and the directory then holds what it held before that
// copy: the rank's previous step, whole.
func TestAcceptFences(t *testing.T) {
	hook, reached, release := midway(0, 2)
	peer := startNode(t, testAuth, hook)
	defer release()
	peer.Accept(1, nil)
	a, b := newSender(t, t.TempDir()), newSender(t, t.TempDir())
	one := a.save(t, 0, 1, 1000)
	_, sentA := pushing(t, 1, a.dir, []int{0}, []string{peer.Addr()}, testAuth)
	waitSent(t, sentA, 0, 1)
	require.NoError(t, peer.next(t).err)
	a.save(t, 0, 2, bigSlot)
	<-reached

	fenced := make(chan struct{})
	go func() {
		peer.Accept(-1, nil)
		close(fenced)
	}()
	// Another node's pushes show when the server stopped accepting: from
	// then on the copy of rank 0 is cut off (and its pusher, back on a new
	// connection, may be refused first).
	_, _ = pushing(t, 1, b.dir, []int{1}, []string{peer.Addr()}, testAuth)
	b.save(t, 1, 1, 1000)
	for step := uint64(1); ; {
		e := peer.next(t)
		if e.err != nil && strings.Contains(e.err.Error(), "accepts none now") {
			break
		}
		require.NoError(t, e.err)
		require.Equal(t, ended{rank: 1, step: step}, e)
		step++
		b.save(t, 1, step, 1000)
	}
	// The copy of rank 0 is held in payloadRead: Accept has not returned.
	// (Were Accept not to wait, it would most likely have returned by now.)
	select {
	case <-fenced:
		t.Fatal("Accept returned while a copy it cut off was still being written")
	default:
	}
	release()
	// The pusher of rank 0, cut off, may come back with step 2 before the
	// cut-off write has ended: refused.
	e := peer.next(t)
	for e.err != nil && strings.Contains(e.err.Error(), "accepts none now") {
		e = peer.next(t)
	}
	require.Equal(t, ended{rank: 0, step: 2}, ended{rank: e.rank, step: e.step})
	require.ErrorIs(t, e.err, net.ErrClosed)
	<-fenced
	held, err := snapshot.Scan(peer.dir)
	require.NoError(t, err)
	var rank0 []snapshot.Holding
	for _, h := range held {
		if h.Rank == 0 {
			rank0 = append(rank0, h)
		}
	}
	require.Len(t, rank0, 1)
	require.Equal(t, uint64(1), rank0[0].Step)
	s, err := snapshot.Verify(rank0[0].Path)
	require.NoError(t, err)
	got, err := snapshot.ReadPayload(s)
	require.NoError(t, err)
	require.Equal(t, one, got)
}

// TestFetch reads a rank's snapshot at a step from a peer, and says
// plainly what is missing.
func TestFetch(t *testing.T) {
	peer := startNode(t, testAuth, nil)
	var payloads [3][]byte
	src := newSender(t, peer.dir)
	payloads[1] = src.save(t, 3, 1, 5000)
	payloads[2] = src.save(t, 3, 2, 6000)
	tests := []struct {
		name    string
		rank    int
		step    uint64
		wantErr []string // "" : fetched
	}{
		{name: "the newer step", rank: 3, step: 2},
		{name: "the older step", rank: 3, step: 1},
		{name: "a step not there", rank: 3, step: 7, wantErr: []string{
			"fetch of rank 3 step 7 from " + peer.Addr(), ErrNotFound.Error(),
			"no complete snapshot of rank 3 at step 7 here (rank-3.slot0: step 1; rank-3.slot1: step 2)"}},
		{name: "a rank not there", rank: 4, step: 1, wantErr: []string{
			ErrNotFound.Error(), "rank-4.slot0: no such file or directory"}},
		{name: "a negative rank", rank: -1, step: 1, wantErr: []string{"ranks are >= 0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			dst, err := snapshot.OpenRank(dir, 3)
			require.NoError(t, err)
			defer dst.Close()
			err = Fetch(context.Background(), peer.Addr(), testAuth, tt.rank, tt.step, dst)
			if tt.wantErr != nil {
				for _, s := range tt.wantErr {
					require.ErrorContains(t, err, s)
				}
				held, err := snapshot.Scan(dir)
				require.NoError(t, err)
				require.Empty(t, held)
				return
			}
			require.NoError(t, err)
			requireHolds(t, dir, 3, tt.step, payloads[tt.step])
		})
	}
}

// TestCloseEndsEverything: Close returns with a pusher connected and a
// connection that never says a word, and has ended every goroutine of the
// server by then (the pusher still runs); Push ends with its context.
func TestCloseEndsEverything(t *testing.T) {
	defer goleak.VerifyNone(t)
	before := goleak.IgnoreCurrent()
	dir := t.TempDir()
	log := newLines()
	s, err := Serve("127.0.0.1:0", dir, testAuth, log.logger())
	require.NoError(t, err)
	s.Accept(0, nil)
	silent, err := net.Dial("tcp", s.Addr())
	require.NoError(t, err)
	defer silent.Close()

	src := newSender(t, t.TempDir())
	src.save(t, 0, 1, 1000)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sent := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- Push(ctx, 0, src.dir, []int{0}, []string{s.Addr()}, testAuth, func(int, uint64, string) { sent <- struct{}{} })
	}()
	<-sent
	require.NoError(t, s.Close())
	// Only the pusher's goroutines are left: nothing of the server.
	goleak.VerifyNone(t, before,
		goleak.IgnoreAnyFunction("github.com/gorun/gorun/internal/snapshot/replica.Push"),
		goleak.IgnoreAnyFunction("github.com/gorun/gorun/internal/snapshot/replica.(*pusher).run"),
		goleak.IgnoreAnyFunction("github.com/gorun/gorun/internal/snapshot.(*announcements).read"))
	_, err = silent.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the server closed the silent connection")
	cancel()
	require.NoError(t, <-done)
}

// TestPushArguments: bad arguments are an error at once.
func TestPushArguments(t *testing.T) {
	tests := []struct {
		name  string
		round int
		dir   string
		ranks []int
		peers []string
		want  string
	}{
		{name: "negative round", round: -1, dir: "d", want: "round -1"},
		{name: "no dir", dir: "", want: "no snapshot directory"},
		{name: "negative rank", dir: "d", ranks: []int{-2}, want: "rank -2"},
		{name: "rank twice", dir: "d", ranks: []int{1, 2, 1}, want: "rank 1 named twice"},
		{name: "peer without port", dir: "d", peers: []string{"host"}, want: `peer "host": want host:port`},
		{name: "peer twice", dir: "d", peers: []string{"a:1", "a:1"}, want: "peer a:1 named twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Push(context.Background(), tt.round, tt.dir, tt.ranks, tt.peers, testAuth, nil)
			require.ErrorContains(t, err, tt.want)
		})
	}
}
