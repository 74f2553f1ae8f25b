package comm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"
)

// store is rank 0's bootstrap store: it collects every rank's address and,
// once all WorldSize ranks have registered (each authenticated on the job
// secret, for the round's token), sends the whole table to each and stops
// listening.
type store struct {
	ln      net.Listener
	auth    auth
	world   int
	timeout time.Duration
	logf    func(format string, args ...any)
	done    chan error
}

type registration struct {
	conn net.Conn
	rank int // proven by the handshake
	h    hello
	err  error
}

// startStore listens on the master address; serve runs in a goroutine
// until the table is out, the deadline passes or ctx ends.
func startStore(ctx context.Context, cfg Config, deadline time.Time, logf func(string, ...any)) (*store, error) {
	addr := net.JoinHostPort(cfg.MasterAddr, strconv.Itoa(cfg.MasterPort))
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("comm: bootstrap store: listen on %s: %w", addr, err)
	}
	s := &store{ln: ln, auth: newAuth(cfg.Secret, cfg.Token), world: cfg.WorldSize, timeout: cfg.timeout(), logf: logf, done: make(chan error, 1)}
	go func() { s.done <- s.serve(ctx, deadline) }()
	return s, nil
}

func (s *store) serve(ctx context.Context, deadline time.Time) error {
	regs := make(chan registration)
	quit := make(chan struct{})
	var pending pendingConns
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // accept loop: ends when the listener closes
		defer wg.Done()
		slots := make(chan struct{}, maxPendingAuth)
		for {
			slots <- struct{}{}
			c, err := s.ln.Accept()
			if err != nil {
				return
			}
			if !pending.add(c) {
				<-slots
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, ok := s.register(c)
				pending.done(c)
				<-slots
				if !ok {
					return
				}
				select {
				case regs <- r:
				case <-quit:
					c.Close()
				}
			}()
		}
	}()

	slots := make([]net.Conn, s.world)
	peers := make([]peer, s.world)
	registered := 0
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	var failure error
	for registered < s.world && failure == nil {
		select {
		case r := <-regs:
			if msg := s.check(r, slots); msg != "" {
				_ = writeMsg(r.conn, table{Error: msg}, s.timeout)
				r.conn.Close()
				continue
			}
			slots[r.h.Rank], peers[r.h.Rank] = r.conn, r.h.Peer
			registered++
		case <-timer.C:
			failure = fmt.Errorf("ranks %v did not register within %s", missing(slots), s.timeout)
		case <-ctx.Done():
			failure = ctx.Err()
			if errors.Is(failure, context.DeadlineExceeded) {
				failure = fmt.Errorf("ranks %v did not register within %s", missing(slots), s.timeout)
			}
		}
	}
	s.ln.Close()
	close(quit)
	pending.closeAll()
	answer := table{Peers: peers}
	if failure != nil {
		answer = table{Error: "bootstrap store on rank 0: " + failure.Error()}
	}
	var errs []error
	for rank, c := range slots {
		if c == nil {
			continue
		}
		if err := writeMsg(c, answer, s.timeout); err != nil && failure == nil {
			errs = append(errs, &PeerError{Rank: rank, Op: "bootstrap", Err: err})
		}
		c.Close()
	}
	wg.Wait()
	if failure != nil {
		return fmt.Errorf("comm: bootstrap store: %w", failure)
	}
	return errors.Join(errs...)
}

// register authenticates c and reads its registration; a connection
// refused for authentication is closed (and logged): ok is false.
func (s *store) register(c net.Conn) (r registration, ok bool) {
	isRank := func(rank int) bool { return rank >= 0 && rank < s.world }
	rank, err := s.auth.accept(c, roleStore, 0, isRank, s.timeout)
	if err != nil {
		var refusal *authRefusal
		if errors.As(err, &refusal) {
			s.logf("bootstrap store refused a connection from %s: %v", c.RemoteAddr(), err)
			refusal.tell(c)
		}
		c.Close()
		return r, false
	}
	r = registration{conn: c, rank: rank}
	r.err = readMsg(c, &r.h, s.timeout, maxSmall)
	return r, true
}

// check returns why r cannot register, or "".
func (s *store) check(r registration, slots []net.Conn) string {
	switch {
	case r.err != nil:
		return "bad registration: " + r.err.Error()
	case r.h.Rank != r.rank:
		return fmt.Sprintf("registration for rank %d on a connection authenticated as rank %d", r.h.Rank, r.rank)
	case r.h.WorldSize != s.world:
		return fmt.Sprintf("world size %d does not match rank 0's %d", r.h.WorldSize, s.world)
	case r.h.Rank < 0 || r.h.Rank >= s.world:
		return fmt.Sprintf("rank %d outside world size %d", r.h.Rank, s.world)
	case slots[r.h.Rank] != nil:
		return fmt.Sprintf("rank %d registered twice", r.h.Rank)
	}
	return ""
}

func missing(slots []net.Conn) []int {
	var out []int
	for r, c := range slots {
		if c == nil {
			out = append(out, r)
		}
	}
	sort.Ints(out)
	return out
}
