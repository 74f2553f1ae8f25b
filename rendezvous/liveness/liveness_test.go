package liveness

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gorun/gorun/internal/reach"
	"github.com/gorun/gorun/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is the protocol as the prober sees it, recording its calls.
type recorder struct {
	mu      sync.Mutex
	reports [][]string // the ids of each Report
	fenced  []string
}

func (r *recorder) Report(_ context.Context, _ int, ids []string, _ Peer) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reports = append(r.reports, ids)
	return nil
}

func (r *recorder) Fence(_ context.Context, p Peer) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fenced = append(r.fenced, p.ID)
	return nil
}

// answering is a peer whose agent answers probes.
func answering(t *testing.T, id string) Peer {
	l, err := reach.Listen("127.0.0.1")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return Peer{ID: id, Host: id, Addr: "127.0.0.1", Reach: l.Port()}
}

// silent is a peer that takes connections and never answers: a node
// whose packets back are dropped.
func silent(t *testing.T, id string) Peer {
	return Peer{ID: id, Host: id, Addr: "127.0.0.1", Reach: testutil.SilentPort(t)}
}

// gone is a peer whose agent died with its kernel up: its port refuses.
func gone(t *testing.T, id string) Peer {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return Peer{ID: id, Host: id, Addr: "127.0.0.1", Reach: port}
}

// Check over real probes: an answering peer is no report, a refused
// probe fences, a silent peer is reported with every other unreachable
// peer of the round, once per round.
func TestProberCheck(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{}
	p := NewProber(rec, zerolog.Nop())

	require.NoError(t, p.Check(ctx, 1, 0, answering(t, "a")))
	require.Empty(t, rec.reports)
	require.Empty(t, rec.fenced)

	require.NoError(t, p.Check(ctx, 1, 2, gone(t, "b")))
	require.Equal(t, []string{"b"}, rec.fenced)
	require.Empty(t, rec.reports)

	c := silent(t, "c")
	require.NoError(t, p.Check(ctx, 1, 4, c))
	require.Equal(t, [][]string{{"b", "c"}}, rec.reports, "the report names every peer this node found down in round 1")
	require.NoError(t, p.Check(ctx, 1, 5, c))
	require.Len(t, rec.reports, 1, "a peer is reported once a round")
	require.NoError(t, p.Check(ctx, 2, 4, c))
	require.Equal(t, [][]string{{"b", "c"}, {"c"}}, rec.reports, "a new round forgets the old one's reports")
}

var (
	errConnRefused = os.NewSyscallError("connect", syscall.ECONNREFUSED)
	errConnReset   = os.NewSyscallError("read", syscall.ECONNRESET)
)

func TestAgentGone(t *testing.T) {
	for _, tc := range []struct {
		err  error
		gone bool
	}{
		{&net.OpError{Op: "dial", Err: errConnRefused}, true},
		{errConnReset, true},
		{context.DeadlineExceeded, false},
		{errors.New("no route to host"), false},
	} {
		require.Equal(t, tc.gone, AgentGone(tc.err), "%v", tc.err)
	}
}

// The gate's moves: closed once left out, a failure starts the count
// again, rejoinPasses passes in a row open it and forget the node was
// left out.
func TestGateNext(t *testing.T) {
	fail := errors.New("node b: i/o timeout")
	for _, tc := range []struct {
		name string
		from gateState
		err  error
		to   gateState
		open bool
	}{
		{"never left out", gateState{}, nil, gateState{}, true},
		{"never left out, probes not asked", gateState{}, fail, gateState{}, true},
		{"left out, a failure", gateState{leftOut: true, passes: 2}, fail, gateState{leftOut: true, lastErr: fail}, false},
		{"left out, a first pass", gateState{leftOut: true, lastErr: fail}, nil, gateState{leftOut: true, passes: 1, lastErr: fail}, false},
		{"left out, a second pass", gateState{leftOut: true, passes: 1}, nil, gateState{leftOut: true, passes: 2}, false},
		{"left out, the third pass opens", gateState{leftOut: true, passes: 2, lastErr: fail}, nil, gateState{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to, open := tc.from.next(tc.err)
			require.Equal(t, tc.to, to)
			require.Equal(t, tc.open, open)
		})
	}
}

// Over real probes: a node left out stays out while a member does not
// answer, says why, and gets back in after rejoinPasses passes in a row;
// a state that does not name it leaves the gate open.
func TestGateOpen(t *testing.T) {
	ctx := context.Background()
	peers := []Peer{answering(t, "a"), silent(t, "b")}
	g := NewGate("self", func(context.Context) ([]Peer, error) { return peers, nil }, zerolog.Nop())
	g.LeftOut(3, []string{"other"}, "node other left out")
	require.True(t, g.Open(ctx), "not left out")
	require.NoError(t, g.Err())

	g.LeftOut(3, []string{"self"}, "node self left out")
	require.False(t, g.Open(ctx))
	require.ErrorContains(t, g.Err(), "node b")
	peers = peers[:1] // b heals
	for range rejoinPasses - 1 {
		require.False(t, g.Open(ctx))
	}
	require.True(t, g.Open(ctx))
	require.NoError(t, g.Err())
}
