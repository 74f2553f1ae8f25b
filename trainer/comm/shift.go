package comm

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// opShift names Shift in headers. It sits far from the other operation
// codes so that a collective added elsewhere does not take it by accident.
const opShift uint32 = 0x5348 // "SH"

// Shift moves data one step around the ring: every member sends send to
// the next member and receives the previous member's send into recv, at
// once, over the group's links (shared memory between ranks of one node).
// len(recv) must be the previous member's len(send): a member that
// disagrees fails the collective with a *PeerError naming the peer.
// Members may send different lengths. With one member, recv gets a copy of
// send (their lengths must match). As with every collective, every member
// must call it, in the same order as the group's other collectives, and
// after an error the World is unusable.
func (g *Group) Shift(send, recv []byte) error {
	const op = "shift"
	if err := g.begin(op); err != nil {
		return err
	}
	defer g.end()
	if g.Size() == 1 {
		if len(send) != len(recv) {
			return fmt.Errorf("comm: %s: a group of one: len(recv) = %d, want len(send) = %d", op, len(recv), len(send))
		}
		copy(recv, send)
		return nil
	}
	seq := g.seq
	g.seq++
	if le := g.shift(header{op: opShift, seq: seq, n: uint64(len(send))}, header{op: opShift, seq: seq, n: uint64(len(recv))}, send, recv); le != nil {
		return g.blame(op, le)
	}
	return nil
}

// shift sends on a second goroutine while it receives on this one: the
// two directions use different links and depend on nothing of each other.
// The first link error stops both and is returned.
func (g *Group) shift(sendHdr, recvHdr header, send, recv []byte) *linkError {
	var stopped atomic.Bool
	var once sync.Once
	var first *linkError
	abort := func(le *linkError) {
		once.Do(func() {
			first = le
			stopped.Store(true)
			_ = g.next.SetDeadline(time.Now())
			_ = g.prev.SetDeadline(time.Now())
		})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if le := g.sendAll(sendHdr, send, &stopped); le != nil {
			abort(le)
		}
	}()
	if le := g.recvAll(recvHdr, recv, &stopped); le != nil {
		abort(le)
	}
	<-done
	return first
}

// sendAll sends the header, then data in chunks, to next.
func (g *Group) sendAll(h header, data []byte, stopped *atomic.Bool) *linkError {
	if le := g.sendHeader(h, stopped); le != nil {
		return le
	}
	for j := range chunks(len(data)) {
		if le := g.sendChunk(chunk(data, j), stopped); le != nil {
			return le
		}
	}
	return nil
}

// recvAll checks prev's header against h, then receives into data.
func (g *Group) recvAll(h header, data []byte, stopped *atomic.Bool) *linkError {
	if le := g.recvHeader(h, stopped); le != nil {
		return le
	}
	st := step{recvInto: data}
	for j := range chunks(len(data)) {
		if le := g.recvChunk(&st, j, stopped); le != nil {
			return le
		}
	}
	return nil
}
