package comm

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/internal/testutil"
	"github.com/gorun/gorun/trainer/internal/worldtest"
)

func secret(t testing.TB, hexDigit string) jobsecret.Secret {
	t.Helper()
	s, err := jobsecret.Parse(strings.Repeat(hexDigit, 64))
	require.NoError(t, err)
	return s
}

// An impostor with the round's token but another secret is refused by
// the store and by a rank it dials directly, both sides say why, and the
// world of the right secret goes on.
func TestWrongSecretRefused(t *testing.T) {
	right, wrong := secret(t, "a"), secret(t, "b")
	var log0 testutil.SyncBuffer
	impostor := make(chan error, 1)
	worlds := worldtest.Start(t, worldtest.New(t, "test", 2, 2), func(w distenv.Worker) (*World, error) {
		if w.Rank == 1 { // the impostor comes first, as rank 1
			cfg := testConfig(w.MasterPort, 1, 2)
			cfg.Secret = wrong
			_, err := Connect(context.Background(), cfg)
			impostor <- err
		}
		cfg := testConfig(w.MasterPort, w.Rank, 2)
		cfg.Secret = right
		if w.Rank == 0 {
			cfg.Log = &log0
		}
		return Connect(context.Background(), cfg)
	})

	err := <-impostor
	require.ErrorIs(t, err, ErrAuthFailed)
	require.ErrorContains(t, err, "authentication failed: wrong GORUN_JOB_SECRET?")
	require.Contains(t, log0.String(), "bootstrap store refused a connection from 127.0.0.1:")
	require.Contains(t, log0.String(), "authentication failed: wrong GORUN_JOB_SECRET? (it claimed rank 1)")

	// Dialing rank 0 directly, as rank 1.
	cfg := worlds[1].cfg
	cfg.Secret = wrong
	intruder := &World{cfg: cfg, timeout: cfg.Timeout, auth: newAuth(cfg.Secret, cfg.Token), peers: worlds[0].peers, self: worlds[1].self}
	_, err = intruder.dial(context.Background(), 0, kindData, "0,1#0")
	require.ErrorIs(t, err, ErrAuthFailed)
	require.Contains(t, log0.String(), "comm: rank 0: refused a connection from ")

	testutil.RequireRanks(t, testutil.OnRanks(2, func(r int) error { return worlds[r].All().AllReduce(make([]float32, 10)) }))
}

// Ranks without a secret work with each other (the zero Secret is a
// public key), and refuse a rank that has one: the two do not mix.
func TestNoSecret(t *testing.T) {
	worlds := startWorld(t, 2, nil)
	testutil.RequireRanks(t, testutil.OnRanks(2, func(r int) error { return worlds[r].All().Barrier() }))

	cfg := worlds[1].cfg
	cfg.Secret = secret(t, "c")
	intruder := &World{cfg: cfg, timeout: cfg.Timeout, auth: newAuth(cfg.Secret, cfg.Token), peers: worlds[0].peers, self: worlds[1].self}
	_, err := intruder.dial(context.Background(), 0, kindData, "0,1#0")
	require.ErrorIs(t, err, ErrAuthFailed)
}

// A connection that declares a 16 MiB frame (or sends any garbage) before
// the handshake costs no allocation of that size: the listener reads a
// fixed-size hello first, finds no handshake and closes. The world goes on.
func TestGarbageBeforeAuthAllocatesNothing(t *testing.T) {
	var log0 testutil.SyncBuffer
	worlds := startWorld(t, 2, func(c *Config) {
		if c.Rank == 0 {
			c.Log = &log0
		}
	})
	const conns = 8
	frame := make([]byte, helloLen)
	binary.BigEndian.PutUint32(frame, maxTable) // a frame header of 16 MiB, then junk

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range conns {
		c, err := net.Dial("tcp", worlds[0].self.Addr)
		require.NoError(t, err)
		_, err = c.Write(frame)
		require.NoError(t, err)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		n, err := c.Read(make([]byte, 1))
		require.ErrorIs(t, err, io.EOF, "closed without a word")
		require.Zero(t, n)
		c.Close()
	}
	runtime.ReadMemStats(&after)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(maxTable),
		"%d connections declaring %d bytes each", conns, maxTable)
	require.Equal(t, conns, strings.Count(log0.String(), "not a gorun comm handshake"), log0.String())

	testutil.RequireRanks(t, testutil.OnRanks(2, func(r int) error { return worlds[r].All().AllReduce(make([]float32, 1000)) }))
}

// A stray handshake message bigger than the small bound is refused, after
// authentication, without reading it.
func TestReadMsgBound(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		var head [4]byte
		binary.BigEndian.PutUint32(head[:], maxSmall+1)
		_, _ = a.Write(head[:])
	}()
	var h handshake
	err := readMsg(b, &h, 5*time.Second, maxSmall)
	require.ErrorContains(t, err, "exceeds 65536")
}

// A proof from one connection is no use on another: nonces are fresh on
// both sides, and proofs bind role, round and ranks.
func TestProofsBindEverything(t *testing.T) {
	a := newAuth(secret(t, "a"), "run/0")
	dn, ln := make([]byte, nonceLen), make([]byte, nonceLen)
	base := a.proof("dialer", rolePeer, 1, 0, dn, ln)
	other := []struct {
		name string
		mac  []byte
	}{
		{"listener side", a.proof("listener", rolePeer, 1, 0, dn, ln)},
		{"store role", a.proof("dialer", roleStore, 1, 0, dn, ln)},
		{"other round", newAuth(secret(t, "a"), "run/1").proof("dialer", rolePeer, 1, 0, dn, ln)},
		{"other dialer rank", a.proof("dialer", rolePeer, 2, 0, dn, ln)},
		{"other listener rank", a.proof("dialer", rolePeer, 1, 3, dn, ln)},
		{"other dialer nonce", a.proof("dialer", rolePeer, 1, 0, append([]byte{1}, dn[1:]...), ln)},
		{"other listener nonce", a.proof("dialer", rolePeer, 1, 0, dn, append([]byte{1}, ln[1:]...))},
		{"other secret", newAuth(secret(t, "b"), "run/0").proof("dialer", rolePeer, 1, 0, dn, ln)},
	}
	for _, tc := range other {
		require.NotEqual(t, base, tc.mac, tc.name)
	}
}
