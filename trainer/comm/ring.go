package comm

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// chunkBytes is the pipelining unit: a step's data moves in chunks of
// this size, and a chunk is forwarded as soon as it arrived.
const chunkBytes = 512 << 10

// seqLimit is the largest step that runs send-then-receive on one
// goroutine: below the smallest socket buffer, so no cycle of sends can
// block (on average a ring link holds at most one step in flight).
const seqLimit = 64 << 10

// step is one round of a ring collective: send a region to the next
// member, receive a region from the previous one.
type step struct {
	send []byte // sent to next; empty: nothing
	// sendWide, when set, is sent instead of send, as the float64s
	// Widen makes of its float32s (8 bytes on the wire per element).
	sendWide  []float32
	sendAfter int // chunk j is sent after chunk j of this step's receive finished; -1: at once
	// Received bytes either land in recvInto, or, when sum is set, are
	// added: sum(off, b) adds the received bytes b, which belong at byte
	// offset off of sumDst, to the step's source there and stores the
	// result in sumDst (the received bytes have sumDst's element type).
	recvInto  []byte
	sumDst    []byte
	sum       func(off int, b []byte)
	recvAfter int // chunk j is received after chunk j of this step's send left; -1: at once
}

func (s *step) recvLen() int {
	if s.sum != nil {
		return len(s.sumDst)
	}
	return len(s.recvInto)
}

// sendLen is the number of bytes the step sends.
func (s *step) sendLen() int {
	if s.sendWide != nil {
		return 8 * len(s.sendWide)
	}
	return len(s.send)
}

// sendBytes is chunk j of what the step sends; a widened chunk is made
// in g.wide, which only the goroutine that sends uses.
func (g *Group) sendBytes(s *step, j int) []byte {
	if s.sendWide == nil {
		return chunk(s.send, j)
	}
	const per = chunkBytes / 8
	src := s.sendWide[j*per : min(len(s.sendWide), (j+1)*per)]
	if g.wide == nil {
		g.wide = make([]float64, per)
	}
	dst := g.wide[:len(src)]
	Widen(dst, src)
	return bytesOf(dst)
}

func chunks(n int) int { return (n + chunkBytes - 1) / chunkBytes }

func chunk(b []byte, j int) []byte { return b[j*chunkBytes : min(len(b), (j+1)*chunkBytes)] }

// sizeOf is the size of a T in bytes.
func sizeOf[T float32 | float64]() int {
	var x T
	return int(unsafe.Sizeof(x))
}

// bytesOf views f as its bytes, in the machine's order (all ranks share it).
func bytesOf[T float32 | float64](f []T) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), int(unsafe.Sizeof(f[0]))*len(f))
}

// linkError is a failure on the link to one neighbor.
type linkError struct {
	rank int
	err  error
}

// ring runs steps: a header, then each step's chunks, sending on one
// goroutine while receiving on this one, with the dependencies the steps
// name. Any error stops both sides and is reported naming a peer.
func (g *Group) ring(op string, h header, steps []step) error {
	h.seq = g.seq
	g.seq++
	var stopped atomic.Bool
	largest := 0
	for k := range steps {
		largest = max(largest, steps[k].sendLen(), steps[k].recvLen())
	}
	var err *linkError
	if largest <= seqLimit {
		err = g.ringSeq(h, steps, &stopped)
	} else {
		err = g.ringPipelined(h, steps, &stopped)
	}
	if err == nil {
		return nil
	}
	return g.blame(op, err)
}

// blame turns a link error into the PeerError that names the rank at
// fault: a failure the world already knows of (a death seen on the
// control connections) wins over what this link saw.
func (g *Group) blame(op string, le *linkError) error {
	w := g.w
	select {
	case <-w.closing:
		return fmt.Errorf("comm: %s: %w", op, ErrClosed)
	default:
	}
	if le.err == errStopped || !w.failedFlag.Load() {
		// Give the control connections a moment to report a death that
		// caused this link's error (a neighbor that died of it, say).
		t := time.NewTimer(min(w.timeout/4, 250*time.Millisecond))
		select {
		case <-w.failed:
		case <-t.C:
		}
		t.Stop()
	}
	if err := w.broken(op); err != nil && w.failedFlag.Load() {
		return err
	}
	reason := le.err
	var ne net.Error
	switch {
	case w.ctrl[le.rank] != nil && w.ctrl[le.rank].departed.Load():
		reason = fmt.Errorf("it closed its World: %w", le.err)
	case errors.As(le.err, &ne) && ne.Timeout():
		reason = fmt.Errorf("nothing moved for %s (stalled?): %w", g.ioTimeout(), le.err)
	case errors.Is(le.err, io.EOF) || errors.Is(le.err, io.ErrUnexpectedEOF) || errors.Is(le.err, net.ErrClosed):
		reason = fmt.Errorf("connection lost (process died?): %w", le.err)
	}
	pe := &PeerError{Rank: le.rank, Op: op, Err: reason}
	w.fail(pe, true)
	return pe
}

// ioSome reads what c has, at least one byte, within the timeout.
func (g *Group) ioSome(c net.Conn, b []byte, stopped *atomic.Bool) (int, error) {
	if err := c.SetReadDeadline(time.Now().Add(g.ioTimeout())); err != nil {
		return 0, err
	}
	if stopped.Load() || g.w.failedFlag.Load() {
		return 0, errStopped
	}
	return c.Read(b)
}

// io moves one buffer on c within the timeout, unless the collective or
// the world stopped (checked after the deadline is set, so a concurrent
// stop that sets a past deadline is never overwritten unseen).
func (g *Group) io(c net.Conn, write bool, b []byte, stopped *atomic.Bool) error {
	dl := time.Now().Add(g.ioTimeout())
	var err error
	if write {
		err = c.SetWriteDeadline(dl)
	} else {
		err = c.SetReadDeadline(dl)
	}
	if err != nil {
		return err
	}
	if stopped.Load() || g.w.failedFlag.Load() {
		return errStopped
	}
	if write {
		_, err = c.Write(b)
	} else {
		_, err = io.ReadFull(c, b)
	}
	return err
}

func (g *Group) sendHeader(h header, stopped *atomic.Bool) *linkError {
	var b [headerLen]byte
	h.put(b[:])
	if err := g.io(g.next, true, b[:], stopped); err != nil {
		return &linkError{g.nextRank, err}
	}
	return nil
}

func (g *Group) recvHeader(h header, stopped *atomic.Bool) *linkError {
	var b [headerLen]byte
	if err := g.io(g.prev, false, b[:], stopped); err != nil {
		return &linkError{g.prevRank, err}
	}
	if got := getHeader(b[:]); got != h {
		return &linkError{g.prevRank, fmt.Errorf("it called %s, this rank %s", got, h)}
	}
	return nil
}

// shmMin is the smallest chunk sent through shared memory: below it, one
// write on the socket costs less than the slot handshake.
const shmMin = 32 << 10

// sendChunk sends b to next: through a shared slot, or on the socket.
func (g *Group) sendChunk(b []byte, stopped *atomic.Bool) *linkError {
	if g.tx == nil || len(b) < shmMin {
		if err := g.io(g.next, true, b, stopped); err != nil {
			return &linkError{g.nextRank, err}
		}
		return nil
	}
	tx := g.tx
	if tx.free == 0 { // wait for next to free a slot
		var credits [shmSlots]byte
		n, err := g.ioSome(g.next, credits[:], stopped)
		if err != nil {
			return &linkError{g.nextRank, err}
		}
		tx.free += n
	}
	copy(tx.slot(tx.seq), b)
	note := [1]byte{byte(tx.seq)}
	tx.seq++
	tx.free--
	if err := g.io(g.next, true, note[:], stopped); err != nil {
		return &linkError{g.nextRank, err}
	}
	return nil
}

// recvShm takes the next shared slot from prev, stores or adds its n
// bytes, and gives the slot back.
func (g *Group) recvShm(st *step, j, n int, stopped *atomic.Bool) *linkError {
	rx := g.rx
	var note [1]byte
	if err := g.io(g.prev, false, note[:], stopped); err != nil {
		return &linkError{g.prevRank, err}
	}
	if note[0] != byte(rx.seq) {
		return &linkError{g.prevRank, fmt.Errorf("shared memory slot %d announced, %d expected", note[0], byte(rx.seq))}
	}
	slot := rx.slot(rx.seq)[:n]
	rx.seq++
	if st.sum == nil {
		copy(chunk(st.recvInto, j), slot)
	} else {
		st.sum(j*chunkBytes, slot)
	}
	if err := g.io(g.prev, true, []byte{1}, stopped); err != nil {
		return &linkError{g.prevRank, err}
	}
	return nil
}

// floatsOf views b (aligned to T, a multiple of T's size long) as Ts.
func floatsOf[T float32 | float64](b []byte) []T {
	if len(b) == 0 {
		return nil
	}
	var x T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(x)))
}

// recvChunk receives chunk j of st and stores or adds it.
func (g *Group) recvChunk(st *step, j int, stopped *atomic.Bool) *linkError {
	if n := min(st.recvLen()-j*chunkBytes, chunkBytes); g.rx != nil && n >= shmMin {
		return g.recvShm(st, j, n, stopped)
	}
	var err error
	if st.sum == nil {
		err = g.io(g.prev, false, chunk(st.recvInto, j), stopped)
	} else {
		lo := j * chunkBytes
		hi := min(len(st.sumDst), lo+chunkBytes)
		if g.tmp == nil {
			g.tmp = bytesOf(make([]float64, chunkBytes/8)) // aligned for either kind
		}
		tmp := g.tmp[:hi-lo]
		if err = g.io(g.prev, false, tmp, stopped); err == nil {
			st.sum(lo, tmp)
		}
	}
	if err != nil {
		return &linkError{g.prevRank, err}
	}
	return nil
}

// ringSeq runs small steps on this goroutine: each step sends, then
// receives (receives first where a step forwards what it receives).
func (g *Group) ringSeq(h header, steps []step, stopped *atomic.Bool) *linkError {
	if err := g.sendHeader(h, stopped); err != nil {
		return err
	}
	if err := g.recvHeader(h, stopped); err != nil {
		return err
	}
	for s := range steps {
		st := &steps[s]
		send := func() *linkError {
			for j := range chunks(st.sendLen()) {
				if err := g.sendChunk(g.sendBytes(st, j), stopped); err != nil {
					return err
				}
			}
			return nil
		}
		if st.sendAfter != s {
			if err := send(); err != nil {
				return err
			}
		}
		for j := range chunks(st.recvLen()) {
			if err := g.recvChunk(st, j, stopped); err != nil {
				return err
			}
		}
		if st.sendAfter == s {
			if err := send(); err != nil {
				return err
			}
		}
	}
	return nil
}

// ringPipelined sends on a second goroutine: chunk j of a step goes out
// as soon as the receive it depends on is done, while later chunks are
// still arriving.
func (g *Group) ringPipelined(h header, steps []step, stopped *atomic.Bool) *linkError {
	sendBase := make([]int, len(steps)+1) // ordinal of a step's first chunk
	recvBase := make([]int, len(steps)+1)
	for s := range steps {
		sendBase[s+1] = sendBase[s] + chunks(steps[s].sendLen())
		recvBase[s+1] = recvBase[s] + chunks(steps[s].recvLen())
	}
	sent := make(chan struct{}, sendBase[len(steps)])
	recvd := make(chan struct{}, recvBase[len(steps)])
	stop := make(chan struct{})
	var once sync.Once
	var first *linkError
	abort := func(le *linkError) {
		once.Do(func() {
			first = le
			stopped.Store(true)
			close(stop)
			_ = g.next.SetDeadline(time.Now())
			_ = g.prev.SetDeadline(time.Now())
		})
	}
	// wait consumes progress signals until more than ord have arrived.
	wait := func(ch chan struct{}, have *int, ord int) bool {
		for *have <= ord {
			select {
			case <-ch:
				*have++
			case <-stop:
				return false
			case <-g.w.failed:
				abort(&linkError{-1, errStopped})
				return false
			}
		}
		return true
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := g.sendHeader(h, stopped); err != nil {
			abort(err)
			return
		}
		have := 0
		for s := range steps {
			st := &steps[s]
			for j := range chunks(st.sendLen()) {
				if st.sendAfter >= 0 && !wait(recvd, &have, recvBase[st.sendAfter]+j) {
					return
				}
				if err := g.sendChunk(g.sendBytes(st, j), stopped); err != nil {
					abort(err)
					return
				}
				sent <- struct{}{}
			}
		}
	}()
	func() {
		if err := g.recvHeader(h, stopped); err != nil {
			abort(err)
			return
		}
		have := 0
		for s := range steps {
			st := &steps[s]
			for j := range chunks(st.recvLen()) {
				if a := st.recvAfter; a >= 0 {
					if n := chunks(steps[a].sendLen()); n > 0 && !wait(sent, &have, sendBase[a]+min(j, n-1)) {
						return
					}
				}
				if err := g.recvChunk(st, j, stopped); err != nil {
					abort(err)
					return
				}
				recvd <- struct{}{}
			}
		}
	}()
	<-done
	if first != nil && first.rank < 0 {
		first = &linkError{g.prevRank, errStopped}
	}
	return first
}
