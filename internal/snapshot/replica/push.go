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

// pollInterval is how soon a pusher reads its ranks' slot headers again
// when it has a copy to retry (the peer was busy), and how often it reads
// them when it cannot follow the workers' announcements
// (snapshot.Follower); otherwise it reads them when a worker announces a
// complete slot, and every snapshot.SafetyPoll.
const pollInterval = 10 * time.Millisecond

// maxBackoff bounds the wait before a pusher dials a peer it could not
// reach again.
const maxBackoff = time.Second

// Push sends, until ctx ends, each new complete snapshot of ranks (their
// slot files in dir, snapshot.Paths) to every peer (a Server's host:port),
// tagged round: it reads the slots' 64-byte headers (snapshot.Poller)
// when a worker announces a complete slot (snapshot.Follower; every 10 ms
// when the kernel gives no inotify instance, logged) and, when a rank's
// slot shows a complete header it did not show before, streams the newer
// such slot to the peer, one connection per peer. A slot left with a
// higher step than the worker now saves (the job restored an older step)
// does not hold back the new steps in the other slot. It sends the newest step only (a step overwritten before its
// turn is skipped), never writes to dir nor locks anything a worker uses,
// and drops a copy whose slot header changed while it was read (the worker
// began overwriting it): the peer then keeps its previous copy whole. A
// replicated snapshot (snapshot.FlagReplicated: the same state on every
// rank, data parallel) is not sent: every node's own ranks hold it, and a
// lost node's ranks restore from any survivor's.
//
// sent, if not nil, is called after each copy a peer wrote complete, one
// call at a time. A peer's refusal (another round, or one of its own
// ranks), a peer it cannot reach, or a slot file it cannot read (a missing
// or incomplete one is only not sent) is logged once, at each change, to the
// logger of ctx (zerolog.Ctx), and Push goes on: it does not send a
// refused step again but tries the next one; a peer that was busy with
// the rank, or could not be reached, is sent the newest step it has not
// had at the next poll (dialled again). Push returns nil once ctx has ended
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
		p := newPusher(peer, round, dir, ranks, k, report, log.With().Str("peer", peer).Logger())
		wg.Go(func() { p.run(ctx, dir, ranks) })
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
	ranks []rankPush
	keys  keys
	sent  func(rank int, step uint64, peer string)
	log   zerolog.Logger

	conn      net.Conn
	stopClose func() bool // stops the close of conn when ctx ends
	problem   string      // what was last logged as wrong, "" once a copy got through
	retryAt   time.Time   // no dial before
	backoff   time.Duration
}

// rankPush is one rank's slots as a pusher follows them.
type rankPush struct {
	rank int
	poll *snapshot.Poller
	// pending is the newest new slot the peer has not had yet (the peer
	// was busy with the rank, or could not be reached), sent at the next
	// pass unless the poller reports a newer one first.
	pending *snapshot.Slot
	lag     lagWatch // how far the peer's copies are behind the worker
}

func newPusher(peer string, round int, dir string, ranks []int, k keys,
	sent func(rank int, step uint64, peer string), log zerolog.Logger) *pusher {
	p := &pusher{peer: peer, round: round, keys: k, sent: sent, log: log}
	for _, rank := range ranks {
		p.ranks = append(p.ranks, rankPush{rank: rank, poll: snapshot.NewPoller(dir, rank)})
	}
	return p
}

func (p *pusher) run(ctx context.Context, dir string, ranks []int) {
	defer p.disconnect()
	f := snapshot.Follow(dir, ranks, pollInterval)
	defer f.Close()
	if err := f.Err(); err != nil {
		p.log.Warn().Err(err).Dur("poll", pollInterval).Msg("reading the slot headers on a clock")
	}
	for {
		p.pass(ctx)
		if !f.Wait(ctx, p.owes()) {
			return
		}
	}
}

// owes reports whether a rank has a copy pending: the next pass is due
// soon, whatever the workers announce.
func (p *pusher) owes() bool {
	for _, r := range p.ranks {
		if r.pending != nil {
			return true
		}
	}
	return false
}

// pass polls each rank's slots and sends the new snapshot found, or the
// one still pending, to the peer.
func (p *pusher) pass(ctx context.Context) {
	if p.conn == nil && time.Now().Before(p.retryAt) {
		return
	}
	for i := range p.ranks {
		if ctx.Err() != nil {
			return
		}
		r := &p.ranks[i]
		s, ok, err := r.poll.Poll()
		switch {
		case err != nil:
			p.note("unreadable slot", err)
		case ok && s.Replicated():
			// The same state on every rank (data parallel): every node's
			// own ranks hold it, so a copy on another node adds nothing
			// but its traffic and its CRC there.
			r.pending = nil
		case ok:
			r.pending = &s
		}
		if r.pending == nil {
			continue
		}
		s = *r.pending
		p.checkLag(r, s.Step)
		err = p.send(ctx, r.rank, s)
		var v *verdictError
		switch {
		case err == nil:
			r.pending = nil
			r.lag = r.lag.stored(s.Step)
			p.sent(r.rank, s.Step, p.peer)
			if p.problem != "" {
				p.log.Info().Msg("pushes to this peer get through again")
				p.problem = ""
			}
		case errors.Is(err, errChanged):
			// The worker is overwriting it: the poller reports what it
			// writes once it is complete.
			r.pending = nil
		case errors.As(err, &v) && v.status == statusRefused:
			r.pending = nil
			p.note("refused: "+v.reason, err)
		case errors.As(err, &v) && v.status == statusBusy:
			// Tried again at the next poll.
		case errors.Is(err, errDropped):
			r.pending = nil
			p.disconnect() // the server closes it after a dropped copy
			p.log.Info().Int("rank", r.rank).Uint64("step", s.Step).Msg("dropped a copy: the slot was overwritten while it was read")
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

// checkLag logs, at each change, whether the peer's copies of rank r
// fell more than a step behind the worker's newest step, now about to be
// sent (see lagWatch).
func (p *pusher) checkLag(r *rankPush, step uint64) {
	var change lagChange
	held := r.lag.sent
	r.lag, change = r.lag.check(step)
	switch change {
	case lagBehind:
		p.log.Warn().Int("rank", r.rank).Uint64("step", step).Uint64("peer_step", held).
			Msg("snapshot copies to this peer fall behind the worker: until they catch up, a loss of this node sends the job back to the durable directory or the script's checkpoint (see docs/operations.md)")
	case lagCaughtUp:
		p.log.Info().Int("rank", r.rank).Uint64("step", step).Uint64("peer_step", held).
			Msg("snapshot copies to this peer keep up with the worker again")
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

// errChanged says that a slot no longer holds the header the poller
// reported: nothing was sent.
var errChanged = errors.New("the slot changed since it was polled")

// send pushes s, a slot of rank the poller reported, to the peer, or
// returns errChanged, sending nothing, when s's file no longer holds s's
// header (the worker began overwriting it) or holds no payload.
func (p *pusher) send(ctx context.Context, rank int, s snapshot.Slot) error {
	f, err := os.Open(s.Path)
	if err != nil {
		return fmt.Errorf("%w: %w", errChanged, err)
	}
	defer f.Close()
	raw, err := readHeader(f)
	if err != nil {
		return fmt.Errorf("%w: %w", errChanged, err)
	}
	if h, err := snapshot.ParseHeader(raw[:]); err != nil || h != s.Header || checkLength(h) != nil {
		return errChanged
	}
	return p.push(ctx, rank, f, raw, s.Header)
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
