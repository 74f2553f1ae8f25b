package comm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// sockBuf is the socket buffer size asked for on Unix data connections
// (the kernel caps it at net.core.wmem_max/rmem_max). TCP connections keep
// the kernel's autotuning, which grows further.
const sockBuf = 4 << 20

// World is this rank's membership in one round: connections to every
// other rank and the collectives over them. Its methods are safe for
// concurrent use; collectives on one Group run one at a time.
type World struct {
	cfg     Config
	timeout time.Duration
	auth    auth
	logMu   sync.Mutex
	peers   []peer
	self    peer

	listeners []net.Listener
	pending   pendingConns // in their handshake
	wg        sync.WaitGroup
	closing   chan struct{}
	closeOnce sync.Once

	mu       sync.Mutex
	waiting  map[connKey]chan net.Conn
	arrived  map[connKey]net.Conn
	data     []net.Conn
	groupSeq map[string]int
	groups   []*Group // with connections, to unmap their memory on Close

	ctrl []*ctrlConn // by rank; nil for this rank

	failed     chan struct{} // closed on the first failure
	failedFlag atomic.Bool
	// failure is the first failure: a *PeerError (a peer died, stalled or
	// disagreed) or an error that wraps ErrAborted (Abort). Set once,
	// under mu, before failed closes and failedFlag is set.
	failure error

	all *Group
}

type connKey struct {
	kind, group string
	from        int
}

type ctrlConn struct {
	rank     int
	c        net.Conn
	wmu      sync.Mutex
	departed atomic.Bool // the peer said goodbye: its silence is no failure
	// heard is when the last message came from the peer (UnixNano);
	// silent is set once OnSilent was called for the silence since.
	heard  atomic.Int64
	silent atomic.Bool
}

func (cc *ctrlConn) send(m control, timeout time.Duration) error {
	cc.wmu.Lock()
	defer cc.wmu.Unlock()
	return writeMsg(cc.c, m, timeout)
}

// logf writes one line to cfg.Log, if any.
func (w *World) logf(format string, args ...any) {
	if w.cfg.Log == nil {
		return
	}
	w.logMu.Lock()
	defer w.logMu.Unlock()
	fmt.Fprintf(w.cfg.Log, "comm: rank %d: "+format+"\n", append([]any{w.cfg.Rank}, args...)...)
}

// Connect joins the round described by cfg: rank 0 starts the bootstrap
// store, every rank registers there, learns its peers and connects to
// them, each connection authenticated on cfg.Secret. It returns once this
// rank is connected to all of them, or fails within cfg.Timeout (a master
// that never answers, a rank that never registers, a store of another
// round, a store or peer without the job secret: ErrAuthFailed) or when
// ctx ends.
func Connect(ctx context.Context, cfg Config) (*World, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	w := &World{
		cfg: cfg, timeout: cfg.timeout(), auth: newAuth(cfg.Secret, cfg.Token), closing: make(chan struct{}),
		waiting: map[connKey]chan net.Conn{}, arrived: map[connKey]net.Conn{},
		groupSeq: map[string]int{}, failed: make(chan struct{}),
	}
	deadline := time.Now().Add(w.timeout)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := w.connect(ctx); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

func (w *World) connect(ctx context.Context) error {
	var st *store
	if w.cfg.Rank == 0 {
		dl, _ := ctx.Deadline()
		var err error
		if st, err = startStore(ctx, w.cfg, dl, w.logf); err != nil {
			return err
		}
	}
	err := w.bootstrap(ctx)
	if st != nil {
		if serr := <-st.done; serr != nil && err == nil {
			err = serr
		}
	}
	if err != nil {
		return err
	}
	w.ctrl = make([]*ctrlConn, w.cfg.WorldSize)
	for r := w.cfg.Rank + 1; r < w.cfg.WorldSize; r++ {
		c, err := w.dial(ctx, r, kindControl, "")
		if err != nil {
			return err
		}
		w.ctrl[r] = &ctrlConn{rank: r, c: c}
	}
	for r := 0; r < w.cfg.Rank; r++ {
		c, err := w.await(ctx, connKey{kind: kindControl, from: r}, "connect")
		if err != nil {
			return err
		}
		w.ctrl[r] = &ctrlConn{rank: r, c: c}
	}
	ranks := make([]int, w.cfg.WorldSize)
	for r := range ranks {
		ranks[r] = r
	}
	g, err := w.newGroup(ctx, ranks)
	if err != nil {
		return err
	}
	w.all = g
	for _, cc := range w.ctrl {
		if cc != nil {
			cc.heard.Store(time.Now().UnixNano())
			w.wg.Add(1)
			go w.watch(cc)
		}
	}
	if w.cfg.WorldSize > 1 {
		w.wg.Add(1)
		go w.heartbeat()
	}
	return nil
}

// bootstrap registers with the store and reads the peer table.
func (w *World) bootstrap(ctx context.Context) error {
	addr := net.JoinHostPort(w.cfg.MasterAddr, strconv.Itoa(w.cfg.MasterPort))
	c, err := dialRetry(ctx, addr)
	if err != nil {
		return fmt.Errorf("comm: connect: bootstrap store of rank 0 at %s: %w", addr, err)
	}
	defer c.Close()
	bind := w.cfg.BindAddr
	if bind == "" {
		bind = c.LocalAddr().(*net.TCPAddr).IP.String()
	}
	if err := w.auth.dial(c, roleStore, w.cfg.Rank, 0, w.timeout); err != nil {
		return fmt.Errorf("comm: connect: bootstrap store of rank 0 at %s: %w", addr, err)
	}
	if err := w.listen(bind); err != nil {
		return err
	}
	h := hello{Rank: w.cfg.Rank, WorldSize: w.cfg.WorldSize, Peer: w.self}
	if err := writeMsg(c, h, w.timeout); err != nil {
		return fmt.Errorf("comm: connect: register with %s: %w", addr, err)
	}
	var t table
	if err := readMsg(c, &t, time.Until(deadlineOf(ctx, w.timeout))+w.timeout/4, maxTable); err != nil {
		return fmt.Errorf("comm: connect: wait for the peer table from %s: %w", addr, err)
	}
	if t.Error != "" {
		return fmt.Errorf("comm: connect: rank %d refused by the bootstrap store at %s: %s", w.cfg.Rank, addr, t.Error)
	}
	if len(t.Peers) != w.cfg.WorldSize {
		return fmt.Errorf("comm: connect: the store at %s sent %d peers for world size %d", addr, len(t.Peers), w.cfg.WorldSize)
	}
	w.peers = t.Peers
	return nil
}

func deadlineOf(ctx context.Context, d time.Duration) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return time.Now().Add(d)
}

// dialRetry dials addr until it answers or ctx ends: the master may come
// up after this rank.
func dialRetry(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	wait := 20 * time.Millisecond
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("no answer before the timeout: %w", err)
		case <-t.C:
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// listen opens this rank's TCP listener on bind and, on Linux, an
// abstract Unix socket for peers of the same node (abstract sockets have
// no file permissions: admit checks the peer's uid, SO_PEERCRED).
func (w *World) listen(bind string) error {
	ln, err := net.Listen("tcp", net.JoinHostPort(bind, "0"))
	if err != nil {
		return fmt.Errorf("comm: connect: listen on %s: %w", bind, err)
	}
	w.listeners = append(w.listeners, ln)
	w.self.Addr = ln.Addr().String()
	if node := nodeKey(); node != "" && !w.cfg.TCPOnly {
		var nonce [8]byte
		_, _ = rand.Read(nonce[:])
		name := fmt.Sprintf("gorun-comm-%d-%s", os.Getpid(), hex.EncodeToString(nonce[:]))
		if uln, err := net.Listen("unix", "@"+name); err == nil {
			w.listeners = append(w.listeners, uln)
			w.self.Unix, w.self.Node = name, node
		}
	}
	for _, l := range w.listeners {
		w.wg.Add(1)
		go w.acceptLoop(l)
	}
	return nil
}

// nodeKey names this kernel and network namespace: ranks with the same
// key reach each other's abstract Unix sockets.
func nodeKey() string {
	if runtime.GOOS != "linux" {
		return ""
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	ns, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(boot)) + "/" + ns
}

// acceptLoop admits l's connections, at most maxPendingAuth at a time:
// past that, it stops accepting until one is done (the rest wait in the
// kernel's queue), so a flood of connections costs a bounded amount.
func (w *World) acceptLoop(l net.Listener) {
	defer w.wg.Done()
	slots := make(chan struct{}, maxPendingAuth)
	for {
		select {
		case slots <- struct{}{}:
		case <-w.closing:
			return
		}
		c, err := l.Accept()
		if err != nil {
			return
		}
		if !w.pending.add(c) {
			<-slots
			continue
		}
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			defer func() { <-slots }()
			w.admit(c)
		}()
	}
}

// admit authenticates a new connection, reads which connection it is and
// hands it to whoever awaits it. A connection that fails is closed, and
// a refusal logged with its reason; the peer learns only that it was
// refused.
func (w *World) admit(c net.Conn) {
	from, h, err := w.accept(c)
	w.pending.done(c)
	if err != nil {
		defer c.Close()
		select {
		case <-w.closing: // closed under its handshake
			return
		default:
		}
		var refusal *authRefusal
		if errors.As(err, &refusal) || errors.Is(err, errNotSameUser) {
			w.logf("refused a connection from %s: %v", c.RemoteAddr(), err)
		}
		if refusal != nil {
			refusal.tell(c)
		}
		return
	}
	key := connKey{kind: h.Kind, group: h.Group, from: from}
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-w.closing:
		c.Close()
		return
	default:
	}
	if ch, ok := w.waiting[key]; ok {
		delete(w.waiting, key)
		ch <- c
		return
	}
	if _, dup := w.arrived[key]; dup {
		c.Close()
		return
	}
	w.arrived[key] = c
}

// errNotSameUser marks a Unix connection from another user's process.
var errNotSameUser = errors.New("not this user's process")

// accept runs a listener's side of a new connection: the peer's uid on a
// Unix socket, the handshake on the job secret, then (authenticated)
// which connection this is.
func (w *World) accept(c net.Conn) (int, handshake, error) {
	var h handshake
	if err := checkSameUser(c); err != nil {
		return -1, h, fmt.Errorf("%w: %w", errNotSameUser, err)
	}
	isPeer := func(r int) bool { return r >= 0 && r < w.cfg.WorldSize && r != w.cfg.Rank }
	from, err := w.auth.accept(c, rolePeer, w.cfg.Rank, isPeer, w.timeout)
	if err != nil {
		return -1, h, err
	}
	if err := readMsg(c, &h, w.timeout, maxSmall); err != nil {
		return -1, h, err
	}
	if h.Kind != kindControl && h.Kind != kindData {
		_ = writeMsg(c, ack{Error: fmt.Sprintf("unknown connection kind %q", h.Kind)}, w.timeout)
		return -1, h, fmt.Errorf("rank %d: unknown connection kind %q", from, h.Kind)
	}
	if err := writeMsg(c, ack{}, w.timeout); err != nil {
		return -1, h, err
	}
	return from, h, c.SetDeadline(time.Time{})
}

// await returns the connection that peer key.from opens to this rank,
// waiting at most the timeout.
func (w *World) await(ctx context.Context, key connKey, op string) (net.Conn, error) {
	w.mu.Lock()
	if c, ok := w.arrived[key]; ok {
		delete(w.arrived, key)
		w.mu.Unlock()
		return c, nil
	}
	ch := make(chan net.Conn, 1)
	w.waiting[key] = ch
	w.mu.Unlock()
	t := time.NewTimer(w.timeout)
	defer t.Stop()
	var err error
	failed := false
	select {
	case c := <-ch:
		return c, nil
	case <-t.C:
		err = fmt.Errorf("did not connect within %s", w.timeout)
	case <-ctx.Done():
		err = fmt.Errorf("did not connect: %w", ctx.Err())
	case <-w.closing:
		err = ErrClosed
	case <-w.failed: // the world failed or was aborted: nobody need come
		failed = true
	}
	w.mu.Lock()
	delete(w.waiting, key)
	w.mu.Unlock()
	select { // delivered just before we gave up
	case c := <-ch:
		c.Close()
	default:
	}
	if failed {
		return nil, w.broken(op)
	}
	return nil, &PeerError{Rank: key.from, Op: op, Err: err}
}

// dial opens a connection of kind to rank, over a Unix socket (of this
// user's process) when the peer is on this node, and passes the handshake.
func (w *World) dial(ctx context.Context, rank int, kind, group string) (net.Conn, error) {
	p := w.peers[rank]
	network, addr := "tcp", p.Addr
	if p.Unix != "" && p.Node == w.self.Node && w.self.Node != "" && !w.cfg.TCPOnly {
		network, addr = "unix", "@"+p.Unix
	}
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, &PeerError{Rank: rank, Op: "connect", Err: err}
	}
	if uc, ok := c.(*net.UnixConn); ok && kind == kindData {
		_ = uc.SetWriteBuffer(sockBuf)
		_ = uc.SetReadBuffer(sockBuf)
	}
	// The handshake's reads and writes take deadlines, not ctx: an end of
	// ctx (an abort of the world, say) sets one in the past.
	unblock := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer unblock()
	fail := func(err error) (net.Conn, error) {
		c.Close()
		return nil, &PeerError{Rank: rank, Op: "connect", Err: err}
	}
	if err := checkSameUser(c); err != nil {
		return fail(err)
	}
	if err := w.auth.dial(c, rolePeer, w.cfg.Rank, rank, w.timeout); err != nil {
		return fail(err)
	}
	if err := writeMsg(c, handshake{Kind: kind, Group: group}, w.timeout); err != nil {
		return fail(err)
	}
	var a ack
	if err := readMsg(c, &a, w.timeout, maxSmall); err != nil {
		return fail(err)
	}
	if a.Error != "" {
		return fail(errors.New("refused: " + a.Error))
	}
	if !unblock() { // ctx ended under the handshake: its deadline may be set
		return fail(fmt.Errorf("did not connect: %w", ctx.Err()))
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// Rank is this rank's global rank.
func (w *World) Rank() int { return w.cfg.Rank }

// Size is the number of ranks in the world.
func (w *World) Size() int { return w.cfg.WorldSize }

// All is the group of every rank, in rank order.
func (w *World) All() *Group { return w.all }

// Group returns the sub-group of ranks, in that order (the ring follows
// it). Every member must call Group with the same ranks, and members must
// create their groups in the same order; ranks outside the group do not
// call it. It connects to the group's ring neighbors and fails within the
// timeout if they do not come.
func (w *World) Group(ranks []int) (*Group, error) {
	if err := w.broken("group"); err != nil {
		return nil, err
	}
	seen := map[int]bool{}
	member := false
	for _, r := range ranks {
		switch {
		case r < 0 || r >= w.cfg.WorldSize:
			return nil, fmt.Errorf("comm: group %v: rank %d outside world size %d", ranks, r, w.cfg.WorldSize)
		case seen[r]:
			return nil, fmt.Errorf("comm: group %v: rank %d twice", ranks, r)
		}
		seen[r] = true
		member = member || r == w.cfg.Rank
	}
	if !member {
		return nil, fmt.Errorf("comm: group %v: rank %d is not a member", ranks, w.cfg.Rank)
	}
	return w.newGroup(context.Background(), append([]int(nil), ranks...))
}

// newGroup connects this rank to the ring neighbors of ranks.
func (w *World) newGroup(ctx context.Context, ranks []int) (*Group, error) {
	parts := make([]string, len(ranks))
	for i, r := range ranks {
		parts[i] = strconv.Itoa(r)
	}
	base := strings.Join(parts, ",")
	w.mu.Lock()
	key := fmt.Sprintf("%s#%d", base, w.groupSeq[base])
	w.groupSeq[base]++
	w.mu.Unlock()

	g := &Group{w: w, ranks: ranks}
	for i, r := range ranks {
		if r == w.cfg.Rank {
			g.me = i
		}
	}
	n := len(ranks)
	if n == 1 {
		return g, nil
	}
	next, prev := ranks[(g.me+1)%n], ranks[(g.me+n-1)%n]
	type dialed struct {
		c   net.Conn
		err error
	}
	// An abort or failure of the world ends the dial as it ends the await.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-w.failed:
			cancel()
		case <-ctx.Done():
		}
	}()
	ch := make(chan dialed, 1)
	go func() {
		c, err := w.dial(ctx, next, kindData, key)
		ch <- dialed{c, err}
	}()
	pc, perr := w.await(ctx, connKey{kind: kindData, group: key, from: prev}, "connect")
	d := <-ch
	if err := errors.Join(d.err, perr); err != nil {
		for _, c := range []net.Conn{d.c, pc} {
			if c != nil {
				c.Close()
			}
		}
		return nil, err
	}
	g.next, g.prev, g.nextRank, g.prevRank = d.c, pc, next, prev
	w.mu.Lock()
	w.data = append(w.data, d.c, pc)
	w.groups = append(w.groups, g)
	w.mu.Unlock()
	// Same-node links move their data through shared memory: offer ours
	// to next, then take prev's (offers never block, so no ring waits).
	var err error
	if uc, ok := d.c.(*net.UnixConn); ok {
		if g.tx, err = newShmSender(uc, w.timeout); err != nil {
			return nil, &PeerError{Rank: next, Op: "connect", Err: err}
		}
	}
	if uc, ok := pc.(*net.UnixConn); ok {
		if g.rx, err = newShmReceiver(uc, w.timeout); err != nil {
			return nil, &PeerError{Rank: prev, Op: "connect", Err: err}
		}
	}
	if w.failedFlag.Load() { // a failure raced with the new connections
		_ = d.c.SetDeadline(time.Now())
		_ = pc.SetDeadline(time.Now())
	}
	return g, nil
}

// watch reads one peer's control connection: heartbeats, goodbye and
// aborts. Silence past the timeout or a lost connection without goodbye
// fails the world, naming that peer.
func (w *World) watch(cc *ctrlConn) {
	defer w.wg.Done()
	for {
		var m control
		err := readMsg(cc.c, &m, w.timeout, maxSmall)
		if err == nil {
			cc.heard.Store(time.Now().UnixNano())
			cc.silent.Store(false)
		}
		if err != nil {
			select {
			case <-w.closing:
				return
			default:
			}
			if cc.departed.Load() {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				w.fail(&PeerError{Rank: cc.rank, Op: "watch", Err: fmt.Errorf("no heartbeat for %s (stalled?)", w.timeout)}, false)
			} else {
				w.fail(&PeerError{Rank: cc.rank, Op: "watch", Err: fmt.Errorf("connection lost without goodbye (process died?): %w", err)}, false)
			}
			return
		}
		switch m.Type {
		case "bye":
			cc.departed.Store(true)
		case "abort":
			if m.Blame == w.cfg.Rank { // this rank is the one blamed: name the accuser
				w.fail(&PeerError{Rank: cc.rank, Op: "watch", Err: fmt.Errorf("it failed because of this rank: %s", m.Reason)}, false)
			} else {
				w.fail(&PeerError{Rank: m.Blame, Op: "watch", Err: fmt.Errorf("reported by rank %d: %s", cc.rank, m.Reason)}, false)
			}
		}
	}
}

// heartbeat tells every peer this rank is alive, four times per timeout
// (and per Config.SilentAfter, when set), and reports the peers it heard
// nothing from for SilentAfter (Config.OnSilent).
func (w *World) heartbeat() {
	defer w.wg.Done()
	every := w.timeout / 4
	if s := w.cfg.SilentAfter; s > 0 && w.cfg.OnSilent != nil {
		every = min(every, s/4)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-w.closing:
			return
		case <-t.C:
		}
		for _, cc := range w.ctrl {
			if cc != nil && !cc.departed.Load() {
				_ = cc.send(control{Type: "hb"}, w.timeout)
			}
		}
		w.reportSilent()
	}
}

// reportSilent calls OnSilent for each peer heard from no sooner than
// SilentAfter ago, once per silence.
func (w *World) reportSilent() {
	if w.cfg.SilentAfter <= 0 || w.cfg.OnSilent == nil || w.failedFlag.Load() {
		return // a failed world's collectives are over: silence means nothing
	}
	quiet := time.Now().Add(-w.cfg.SilentAfter).UnixNano()
	for _, cc := range w.ctrl {
		if cc == nil || cc.departed.Load() || cc.heard.Load() > quiet || cc.silent.Swap(true) {
			continue
		}
		w.cfg.OnSilent(cc.rank)
	}
}

// fail records the world's first failure, unblocks every collective in
// flight and, when broadcast is set (the failure was seen on a data
// link, which other ranks cannot see), tells every peer whom to blame.
func (w *World) fail(pe *PeerError, broadcast bool) {
	if !w.stop(pe) || !broadcast {
		return
	}
	for _, cc := range w.ctrl {
		if cc != nil && !cc.departed.Load() {
			_ = cc.send(control{Type: "abort", Blame: pe.Rank, Reason: pe.Err.Error()}, min(w.timeout, time.Second))
		}
	}
}

// stop records err as the world's failure if it is the first and
// unblocks every collective in flight: each data connection's deadline
// is set in the past, so a blocked read or write returns at once (and
// io, which checks failedFlag after setting its own deadline, never
// starts a new one). It reports whether err was the first.
func (w *World) stop(err error) bool {
	w.mu.Lock()
	if w.failure != nil {
		w.mu.Unlock()
		return false
	}
	w.failure = err
	w.failedFlag.Store(true)
	close(w.failed)
	conns := append([]net.Conn(nil), w.data...)
	w.mu.Unlock()
	for _, c := range conns {
		_ = c.SetDeadline(time.Now())
	}
	return true
}

// Abort fails the world because its round is over (the agent said so),
// without waiting for any peer: every collective in flight on any of its
// groups returns at once, and every later one fails, with an error that
// wraps ErrAborted and cause (nil: ErrAborted alone). A rank blocked on a
// peer that is gone (a node cut off, a process stopped) is woken by it,
// not by the timeout. Abort sends nothing: peers of the same round learn
// the same from their own agent, and a peer gone cannot be reached. A
// world that failed already keeps its first failure. Close it afterwards
// as ever; Abort is safe to call from any goroutine, more than once.
func (w *World) Abort(cause error) {
	err := ErrAborted
	if cause != nil {
		err = fmt.Errorf("%w: %w", ErrAborted, cause)
	}
	w.stop(err)
}

// broken returns the world's failure as seen by op, ErrClosed after
// Close, or nil.
func (w *World) broken(op string) error {
	select {
	case <-w.closing:
		return fmt.Errorf("comm: %s: %w", op, ErrClosed)
	default:
	}
	if !w.failedFlag.Load() {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if pe, ok := w.failure.(*PeerError); ok {
		return &PeerError{Rank: pe.Rank, Op: op, Err: pe.Err}
	}
	return fmt.Errorf("comm: %s: %w", op, w.failure)
}

// Close says goodbye to every peer (so they do not take this rank's exit
// for a death), closes every connection and listener and waits for this
// World's goroutines. Collectives in flight fail with ErrClosed.
// Closing twice is harmless.
func (w *World) Close() error {
	w.closeOnce.Do(func() {
		for _, cc := range w.ctrl {
			if cc != nil {
				_ = cc.send(control{Type: "bye"}, min(w.timeout, time.Second))
			}
		}
		w.mu.Lock()
		close(w.closing)
		conns := append([]net.Conn(nil), w.data...)
		for k, c := range w.arrived {
			conns = append(conns, c)
			delete(w.arrived, k)
		}
		w.mu.Unlock()
		for _, cc := range w.ctrl {
			if cc != nil {
				conns = append(conns, cc.c)
			}
		}
		for _, l := range w.listeners {
			l.Close()
		}
		w.pending.closeAll()
		for _, c := range conns {
			c.Close()
		}
		w.wg.Wait()
		w.mu.Lock()
		groups := w.groups
		w.mu.Unlock()
		for _, g := range groups { // after any collective in flight
			g.mu.Lock()
			_ = g.tx.close()
			_ = g.rx.close()
			g.mu.Unlock()
		}
	})
	return nil
}
