package comm

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/jobsecret"
)

// fuzzWorld is the world size of FuzzAccept's listener, rank 0.
const fuzzWorld = 4

// FuzzAccept plays a dialer that sends arbitrary bytes to the accepting
// side of a connection, a rank's (World.accept: the handshake on the job
// secret, then the connection's kind) or the bootstrap store's
// (store.register, then check): from the first byte (stage 0), after a
// right magic and round (1), or after a real handshake as rank `rank`
// (2), so the bytes the listener parses once authenticated are reached
// too. Whatever comes, the listener returns (an error, or a proven peer
// and a known connection kind) and never panics; without the secret
// nobody gets in.
func FuzzAccept(f *testing.F) {
	withBody := func(v any) []byte { // a frame as writeMsg sends it
		body, err := json.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
	}
	a := newAuth(fuzzSecret(f), "run/0")
	head := append(append([]byte{}, authMagic[:]...), a.round[:]...) // of a clientHello
	for _, seed := range []struct {
		store, stage byte
		rank         int32
		raw          []byte
	}{
		{0, 0, 1, nil},
		{0, 0, 1, []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")},
		{0, 1, 1, append(make([]byte, 4+nonceLen), make([]byte, macLen)...)},
		{0, 1, 9, append([]byte{0, 0, 0, 9}, make([]byte, nonceLen)...)},
		{0, 2, 1, withBody(handshake{Kind: kindControl})},
		{0, 2, 2, withBody(handshake{Kind: kindData, Group: "g0"})},
		{0, 2, 3, withBody(handshake{Kind: "bogus"})},
		{0, 2, 1, []byte{0xff, 0xff, 0xff, 0xff}},
		{0, 2, 1, append([]byte{0, 0, 0, 9}, `{"kind":`...)},
		{0, 2, 0, withBody(handshake{Kind: kindControl})}, // itself: not a peer
		{1, 2, 2, withBody(hello{Rank: 2, WorldSize: fuzzWorld, Peer: peer{Addr: "127.0.0.1:1"}})},
		{1, 2, 2, withBody(hello{Rank: 3, WorldSize: fuzzWorld})},
		{1, 2, 1, withBody(hello{Rank: 1, WorldSize: 1 << 30})},
		{1, 1, -1, nil},
		{1, 0, 0, head},
	} {
		f.Add(seed.store, seed.stage, seed.rank, seed.raw)
	}
	f.Fuzz(func(t *testing.T, isStore, stage byte, rank int32, raw []byte) {
		const timeout = 2 * time.Second // a stuck listener fails here, not a peer
		d, l := socketPair(t)
		var wg sync.WaitGroup
		defer wg.Wait()
		defer d.Close()
		defer l.Close()
		authed := make(chan error, 1)
		wg.Add(1)
		go func() { // the dialer
			defer wg.Done()
			switch stage % 3 {
			case 0:
				authed <- nil
			case 1:
				authed <- nil
				msg := append(append([]byte{}, head...), binary.BigEndian.AppendUint32(nil, uint32(rank))...)
				raw = append(msg, raw...)
			case 2:
				role := rolePeer
				if isStore%2 == 1 {
					role = roleStore
				}
				authed <- a.dial(d, role, int(rank), 0, timeout)
			}
			wg.Add(1)
			go func() { // read all the listener says
				defer wg.Done()
				_, _ = io.Copy(io.Discard, d)
			}()
			_, _ = d.Write(raw)
			_ = d.CloseWrite() // the listener reads EOF after raw
		}()
		if isStore%2 == 1 {
			s := &store{auth: a, world: fuzzWorld, timeout: timeout, logf: func(string, ...any) {}}
			r, ok := s.register(l)
			l.Close()
			dialErr := <-authed
			if !ok {
				return
			}
			if stage%3 != 2 || dialErr != nil || r.rank != int(rank) || r.rank < 0 || r.rank >= fuzzWorld {
				t.Fatalf("store admitted rank %d (dialer: stage %d, rank %d, %v)", r.rank, stage%3, rank, dialErr)
			}
			if why := s.check(r, make([]net.Conn, fuzzWorld)); why == "" && (r.h.Rank != r.rank || r.h.WorldSize != fuzzWorld) {
				t.Fatalf("store accepted registration %+v on rank %d's connection", r.h, r.rank)
			}
			return
		}
		w := &World{cfg: Config{Rank: 0, WorldSize: fuzzWorld}, timeout: timeout, auth: a}
		from, h, err := w.accept(l)
		l.Close()
		dialErr := <-authed
		if err != nil {
			return
		}
		if stage%3 != 2 || dialErr != nil || from != int(rank) || from < 1 || from >= fuzzWorld {
			t.Fatalf("admitted rank %d (dialer: stage %d, rank %d, %v)", from, stage%3, rank, dialErr)
		}
		if h.Kind != kindControl && h.Kind != kindData {
			t.Fatalf("admitted connection kind %q", h.Kind)
		}
	})
}

// socketPair is two connected Unix sockets: unlike net.Pipe, a write
// does not wait for the reader, and CloseWrite ends what one side sends.
func socketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var cs [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = c.(*net.UnixConn)
	}
	return cs[0], cs[1]
}

// fuzzSecret is a fixed job secret.
func fuzzSecret(tb testing.TB) jobsecret.Secret {
	tb.Helper()
	s, err := jobsecret.Parse(strings.Repeat("a", 2*sha256.Size))
	if err != nil {
		tb.Fatal(err)
	}
	return s
}
