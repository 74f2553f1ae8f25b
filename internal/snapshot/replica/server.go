package replica

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/internal/snapshot"
)

// maxConns caps a server's connections at once (in their handshake or
// serving); one over it is closed at once.
const maxConns = 64

// Server receives the snapshots other nodes' agents push into its
// directory, for the round and ranks that Accept names, and serves
// fetches of the snapshots there.
type Server struct {
	ln    net.Listener
	dir   string
	keys  keys
	log   zerolog.Logger
	hooks hooks

	wg sync.WaitGroup // the accept loop and every connection

	mu        sync.Mutex
	accepting acceptance
	conns     map[net.Conn]struct{}
	writes    map[int]*write // by rank: pushes being written now
	// slots are the ranks' open slot files, kept from one push to the
	// next within a round (OpenRank verifies both slots whole); a push
	// being written holds its rank's in its write instead.
	slots  map[int]*snapshot.RankSlots
	closed bool
}

// hooks let tests see into a server at chosen points; nil ones are not
// called.
type hooks struct {
	// payloadRead is told, as a push's payload arrives, the bytes of it
	// read so far; it runs on the connection's goroutine and may block it.
	payloadRead func(rank int, step, n uint64)
	// pushEnded is told how each push ended: nil when written complete.
	pushEnded func(rank int, step uint64, err error)
	// accepted is given each connection as it is accepted.
	accepted func(net.Conn)
}

// write is a push being written.
type write struct {
	round int
	conn  net.Conn
	slots *snapshot.RankSlots // nil until opened
	done  chan struct{}       // closed once the write returned
}

// Serve listens on addr ("host:port", port 0 for any) and serves pushes
// into dir (an existing directory, the agent's snapshot directory) and
// fetches from it, authenticated by auth, until Close. It accepts no push
// until Accept names a round. Errors name the address or directory.
func Serve(addr, dir string, auth Auth, log zerolog.Logger) (*Server, error) {
	return serve(addr, dir, auth, log, hooks{})
}

func serve(addr, dir string, auth Auth, log zerolog.Logger, h hooks) (*Server, error) {
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("replica: snapshot directory: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("replica: snapshot directory %s is not a directory", dir)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("replica: listen: %w", err)
	}
	s := &Server{
		ln: ln, dir: dir, keys: auth.keys(), hooks: h,
		log:       log.With().Str("component", "snapshot-replica").Logger(),
		accepting: newAcceptance(-1, nil),
		conns:     map[net.Conn]struct{}{},
		writes:    map[int]*write{},
		slots:     map[int]*snapshot.RankSlots{},
	}
	s.wg.Go(s.acceptLoop)
	return s, nil
}

// Addr returns the address the server listens on, host:port, for peers
// to push to and fetch from.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Accept makes the server accept pushes tagged round, except of the ranks
// in own (the ranks this node runs in that round); a negative round
// (Accept(-1, nil)) accepts none, as between rounds. It returns once no
// push that the new setting refuses is being written: those in progress
// are cut off, which leaves the slot they wrote incomplete and the rank's
// other slot whole. So after Accept(-1, nil) the directory changes no more.
func (s *Server) Accept(round int, own []int) {
	a := newAcceptance(round, own)
	s.mu.Lock()
	s.accepting = a
	var cut []*write
	for rank, w := range s.writes {
		if a.admit(w.round, rank) != nil {
			w.conn.Close()
			cut = append(cut, w)
		}
	}
	s.mu.Unlock()
	for _, w := range cut {
		<-w.done
	}
	// Others (the agent's fetches, the workers) may write the files before
	// the next push: open them afresh then.
	s.mu.Lock()
	err := s.closeSlots()
	s.mu.Unlock()
	if err != nil {
		s.log.Warn().Err(err).Msg("closing slot files")
	}
	s.log.Debug().Int("round", round).Ints("own", own).Int("cut_off", len(cut)).Msg("accepting pushes")
}

// Close stops the server: it closes the listener and every connection
// (a push being written is cut off, leaving its slot incomplete), waits
// for every goroutine of the server to return, and returns the listener's
// close error joined with the slot files'.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return errors.Join(err, s.closeSlots())
}

// closeSlots closes the kept slot files; s.mu is held, or nothing runs.
func (s *Server) closeSlots() error {
	var errs []error
	for rank, slots := range s.slots {
		errs = append(errs, slots.Close())
		delete(s.slots, rank)
	}
	return errors.Join(errs...)
}

func (s *Server) acceptLoop() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Error().Err(err).Msg("no longer accepting connections")
			}
			return
		}
		if !s.track(c) {
			continue
		}
		if s.hooks.accepted != nil {
			s.hooks.accepted(c)
		}
		s.wg.Go(func() {
			defer s.untrack(c)
			s.handle(c)
		})
	}
}

// track registers c, or closes it when the server is closed or full.
func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.conns) >= maxConns {
		c.Close()
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.Close()
}

// handle authenticates c and serves what it came for.
func (s *Server) handle(c net.Conn) {
	peer := c.RemoteAddr().String()
	r, err := s.keys.accept(c)
	if err != nil {
		var ref *refusal
		if errors.As(err, &ref) {
			// Logged before the dialer is told, so its error never comes first.
			s.log.Warn().Str("peer", peer).Msg("refused a connection: " + ref.why)
			if ref.status != statusOK {
				_ = writeVerdict(c, ref.status, ref.why)
			}
		} else {
			s.log.Debug().Str("peer", peer).Err(err).Msg("handshake failed")
		}
		return
	}
	switch r {
	case rolePush:
		s.servePushes(c, peer)
	case roleFetch:
		s.serveFetch(c, peer)
	}
}

// servePushes receives pushes on c until the pusher or the server closes
// it, or a copy fails.
func (s *Server) servePushes(c net.Conn, peer string) {
	for {
		var b [pushRequestLen]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return
		}
		req, h, err := decodePushRequest(b)
		if err != nil {
			s.log.Warn().Str("peer", peer).Err(err).Msg("a push the server cannot parse")
			_ = writeVerdict(c, statusBadRequest, err.Error())
			return
		}
		w, st, err := s.begin(req.round, req.rank, c)
		if err != nil {
			s.log.Debug().Str("peer", peer).Int("rank", req.rank).Uint64("step", h.Step).Err(err).Msg("push refused")
			s.ended(req.rank, h.Step, err)
			if writeVerdict(c, st, err.Error()) != nil {
				return
			}
			continue
		}
		err = writeVerdict(c, statusOK, "")
		if err == nil {
			err = s.receive(c, w, req.rank, h)
		}
		s.end(req.rank, w)
		s.ended(req.rank, h.Step, err)
		if err != nil {
			s.log.Warn().Str("peer", peer).Int("rank", req.rank).Uint64("step", h.Step).Err(err).
				Msg("a pushed copy was not written; the rank's previous copy here is whole")
			_ = writeVerdict(c, statusFailed, err.Error())
			return
		}
		if writeVerdict(c, statusOK, "") != nil {
			return
		}
	}
}

// begin admits a push of rank tagged round arriving on c, or says why not
// (statusRefused or statusBusy).
func (s *Server) begin(round, rank int, c net.Conn) (*write, status, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.accepting.admit(round, rank); err != nil {
		return nil, statusRefused, err
	}
	if s.writes[rank] != nil {
		// The sender dropped a copy and came back on a new connection
		// before this end read the rest of the old one.
		return nil, statusBusy, fmt.Errorf("a copy of rank %d is still being written here", rank)
	}
	w := &write{round: round, conn: c, slots: s.slots[rank], done: make(chan struct{})}
	delete(s.slots, rank)
	s.writes[rank] = w
	return w, statusOK, nil
}

// end unregisters w, whose write returned, and keeps its slot files.
func (s *Server) end(rank int, w *write) {
	s.mu.Lock()
	delete(s.writes, rank)
	if w.slots != nil {
		s.slots[rank] = w.slots
	}
	s.mu.Unlock()
	close(w.done)
}

func (s *Server) ended(rank int, step uint64, err error) {
	if s.hooks.pushEnded != nil {
		s.hooks.pushEnded(rank, step, err)
	}
}

// receive writes the payload of h arriving on c into rank's slots in the
// directory (w's, opened if need be), with the header last, and only when
// the whole payload came, the sender committed it and its CRC-32 is the
// header's.
func (s *Server) receive(c net.Conn, w *write, rank int, h snapshot.Header) error {
	var got func(uint64)
	if s.hooks.payloadRead != nil {
		got = func(n uint64) { s.hooks.payloadRead(rank, h.Step, n) }
	}
	if w.slots == nil {
		slots, err := snapshot.OpenRank(s.dir, rank)
		if err != nil {
			return err
		}
		w.slots = slots
	}
	return w.slots.Write(h, newPayloadReader(c, h, got))
}

// serveFetch answers the one fetch request on c.
func (s *Server) serveFetch(c net.Conn, peer string) {
	var b [fetchRequestLen]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return
	}
	req := decodeFetchRequest(b)
	if req.rank < 0 {
		_ = writeVerdict(c, statusBadRequest, fmt.Sprintf("rank %d: ranks are >= 0", req.rank))
		return
	}
	f, raw, h, err := findSlot(s.dir, req.rank, req.step)
	if err != nil {
		s.log.Info().Str("peer", peer).Err(err).Msg("fetch of a snapshot not here")
		_ = writeVerdict(c, statusNotFound, err.Error())
		return
	}
	defer f.Close()
	if writeVerdict(c, statusOK, "") != nil {
		return
	}
	if _, err := c.Write(raw[:]); err != nil {
		return
	}
	if err := sendPayload(c, f, raw, h); err != nil {
		s.log.Warn().Str("peer", peer).Int("rank", req.rank).Uint64("step", req.step).Err(err).Msg("fetch not served")
	}
}

// findSlot opens the slot file of rank in dir whose header is complete
// and of step, or says what the rank's slots hold instead.
func findSlot(dir string, rank int, step uint64) (*os.File, [headerLen]byte, snapshot.Header, error) {
	var held []string
	for _, p := range snapshot.Paths(dir, rank) {
		f, err := os.Open(p)
		if err != nil {
			held = append(held, fmt.Sprintf("%s: %v", filepath.Base(p), errors.Unwrap(err)))
			continue
		}
		raw, err := readHeader(f)
		var h snapshot.Header
		if err == nil {
			h, err = snapshot.ParseHeader(raw[:])
		}
		switch {
		case err != nil:
			held = append(held, fmt.Sprintf("%s: incomplete", filepath.Base(p)))
		case h.Step != step:
			held = append(held, fmt.Sprintf("%s: step %d", filepath.Base(p), h.Step))
		case checkLength(h) != nil:
			held = append(held, fmt.Sprintf("%s: %v", filepath.Base(p), checkLength(h)))
		default:
			return f, raw, h, nil
		}
		f.Close()
	}
	return nil, [headerLen]byte{}, snapshot.Header{}, fmt.Errorf("no complete snapshot of rank %d at step %d here (%s)", rank, step, strings.Join(held, "; "))
}
