package replica

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/internal/snapshot"
)

// pollInterval is how often a pusher reads its ranks' slot headers: the
// workers write slots through a mapping, which raises no inotify event.
const pollInterval = 10 * time.Millisecond

// maxBackoff bounds the wait before a pusher dials a peer it could not
// reach again.
const maxBackoff = time.Second

// Push sends, until ctx ends, each new complete snapshot of ranks (their
// slot files in dir, snapshot.Paths) to every peer (a Server's host:port),
// tagged round: it reads the slots' 64-byte headers every 10 ms and, when
// a rank's newest complete step is newer than the one it last sent a peer,
// streams that slot to the peer, one connection per peer. It sends the
// newest step only (a step overwritten before its turn is skipped), never
// writes to dir nor locks anything a worker uses, and drops a copy whose
// slot header changed while it was read (the worker began overwriting
// it): the peer then keeps its previous copy whole.
//
// sent, if not nil, is called after each copy a peer wrote complete, one
// call at a time. A peer's refusal (another round, or one of its own
// ranks) or a peer it cannot reach is logged once, at each change, to the
// logger of ctx (zerolog.Ctx), and Push goes on: it tries the next step,
// and dials an unreachable peer again. Push returns nil once ctx has ended
// and every connection is closed; it returns an error at once, having
// sent nothing, when round is negative, dir is empty, or a rank or peer
// is invalid or named twice.
func Push(ctx context.Context, round int, dir string, ranks []int, peers []string, auth Auth,
	sent func(rank int, step uint64, peer string)) error {
	if err := checkPush(round, dir, ranks, peers); err != nil {
		return err
	}
	log := zerolog.Ctx(ctx).With().Str("component", "snapshot-replica").Int("round", round).Logger()
	var mu sync.Mutex
	report := func(rank int, step uint64, peer string) {
		if sent != nil {
			mu.Lock()
			defer mu.Unlock()
			sent(rank, step, peer)
		}
	}
	k := auth.keys()
	var wg sync.WaitGroup
	for _, peer := range peers {
		p := &pusher{
			peer: peer, round: round, dir: dir, ranks: ranks, keys: k, sent: report,
			log: log.With().Str("peer", peer).Logger(), done: map[int]uint64{},
		}
		wg.Go(func() { p.run(ctx) })
	}
	wg.Wait()
	return nil
}

func checkPush(round int, dir string, ranks []int, peers []string) error {
	switch {
	case round < 0:
		return fmt.Errorf("replica: push: round %d: rounds are >= 0", round)
	case dir == "":
		return errors.New("replica: push: no snapshot directory given")
	}
	for i, r := range ranks {
		if r < 0 {
			return fmt.Errorf("replica: push: rank %d: ranks are >= 0", r)
		}
		if slices.Contains(ranks[:i], r) {
			return fmt.Errorf("replica: push: rank %d named twice", r)
		}
	}
	for i, p := range peers {
		if _, _, err := net.SplitHostPort(p); err != nil {
			return fmt.Errorf("replica: push: peer %q: want host:port: %w", p, err)
		}
		if slices.Contains(peers[:i], p) {
			return fmt.Errorf("replica: push: peer %s named twice", p)
		}
	}
	return nil
}

// pusher sends one Push's ranks to one peer.
type pusher struct {
	peer  string
	round int
	dir   string
	ranks []int
	keys  keys
	sent  func(rank int, step uint64, peer string)
	log   zerolog.Logger

	conn      net.Conn
	stopClose func() bool    // stops the close of conn when ctx ends
	done      map[int]uint64 // by rank: the newest step sent (or refused)
	problem   string         // what was last logged as wrong, "" once a copy got through
	retryAt   time.Time      // no dial before
	backoff   time.Duration
}

func (p *pusher) run(ctx context.Context) {
	defer p.disconnect()
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		p.pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pass sends each rank's newest complete snapshot if the peer has not had
// it yet.
func (p *pusher) pass(ctx context.Context) {
	if p.conn == nil && time.Now().Before(p.retryAt) {
		return
	}
	for _, rank := range p.ranks {
		if ctx.Err() != nil {
			return
		}
		f, raw, h, ok := newest(p.dir, rank)
		if !ok {
			continue
		}
		if last, ok := p.done[rank]; ok && h.Step <= last {
			f.Close()
			continue
		}
		err := p.push(ctx, rank, f, raw, h)
		f.Close()
		var v *verdictError
		switch {
		case err == nil:
			p.done[rank] = h.Step
			p.sent(rank, h.Step, p.peer)
			if p.problem != "" {
				p.log.Info().Msg("pushes to this peer get through again")
				p.problem = ""
			}
		case errors.As(err, &v) && v.status == statusRefused:
			p.done[rank] = h.Step
			p.note("refused: "+v.reason, err)
		case errors.As(err, &v) && v.status == statusBusy:
			// Tried again at the next poll.
		case errors.Is(err, errDropped):
			p.disconnect() // the server closes it after a dropped copy
			p.log.Info().Int("rank", rank).Uint64("step", h.Step).Msg("dropped a copy: the slot was overwritten while it was read")
		default:
			p.disconnect()
			if ctx.Err() == nil {
				p.note("failed", err)
				p.backoff = min(max(2*p.backoff, pollInterval), maxBackoff)
				p.retryAt = time.Now().Add(p.backoff)
			}
			return
		}
	}
}

// note logs err unless what went wrong last is the same kind.
func (p *pusher) note(kind string, err error) {
	if kind == p.problem {
		return
	}
	p.problem = kind
	p.log.Warn().Err(err).Msg("snapshot copies to this peer do not get through")
}

// push sends the slot file f of rank, whose header read raw and parsed h,
// to the peer.
func (p *pusher) push(ctx context.Context, rank int, f *os.File, raw [headerLen]byte, h snapshot.Header) error {
	if err := p.connect(ctx); err != nil {
		return err
	}
	what := fmt.Sprintf("replica: push of rank %d step %d to %s", rank, h.Step, p.peer)
	req := pushRequest{round: p.round, rank: rank, header: raw}.encode()
	if _, err := p.conn.Write(req[:]); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := readVerdict(p.conn, what); err != nil {
		return err
	}
	if err := sendPayload(p.conn, f, raw, h); err != nil {
		if errors.Is(err, errDropped) {
			return err
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	p.backoff = 0
	return readVerdict(p.conn, what)
}

// connect dials the peer and authenticates, unless connected.
func (p *pusher) connect(ctx context.Context) error {
	if p.conn != nil {
		return nil
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", p.peer)
	if err != nil {
		return fmt.Errorf("replica: push to %s: %w", p.peer, err)
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	if err := p.keys.dial(c, rolePush); err != nil {
		stop()
		c.Close()
		return fmt.Errorf("replica: push to %s: %w", p.peer, err)
	}
	p.conn, p.stopClose = c, stop
	return nil
}

func (p *pusher) disconnect() {
	if p.conn != nil {
		p.stopClose()
		p.conn.Close()
		p.conn = nil
	}
}

// newest opens rank's slot file in dir whose header is complete and of
// the highest step, and returns it with its header; false when neither is.
// The payload is not verified here: the receiver checks its CRC-32.
func newest(dir string, rank int) (*os.File, [headerLen]byte, snapshot.Header, bool) {
	var (
		best    *os.File
		bestRaw [headerLen]byte
		bestH   snapshot.Header
	)
	for _, path := range snapshot.Paths(dir, rank) {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		raw, err := readHeader(f)
		var h snapshot.Header
		if err == nil {
			h, err = snapshot.ParseHeader(raw[:])
		}
		if err != nil || checkLength(h) != nil || (best != nil && h.Step <= bestH.Step) {
			f.Close()
			continue
		}
		if best != nil {
			best.Close()
		}
		best, bestRaw, bestH = f, raw, h
	}
	return best, bestRaw, bestH, best != nil
}
