// Package reach tells whether one node can reach another over the
// network, both ways: each agent answers on a small TCP port, and a probe
// is a connection to it that sends one byte and reads it back. A probe
// needs packets to flow in both directions (the handshake and the echo),
// so a link that drops one way only fails it, as a cut link does; a
// process that is slow or stopped elsewhere on the node does not.
package reach

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// probeByte is what a probe sends and the listener echoes.
const probeByte = 'r'

// Listener answers probes on one TCP port until Close.
type Listener struct {
	l  net.Listener
	wg sync.WaitGroup
}

// Listen answers probes on host (an address of this node) at a port the
// kernel picks; Port says which. It fails when host cannot be bound.
func Listen(host string) (*Listener, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, fmt.Errorf("reach: listen on %s: %w", host, err)
	}
	r := &Listener{l: l}
	r.wg.Add(1)
	go r.serve()
	return r, nil
}

// Port is the port the listener answers on.
func (r *Listener) Port() int { return r.l.Addr().(*net.TCPAddr).Port }

// Close stops answering and waits for the connections being answered.
func (r *Listener) Close() error {
	err := r.l.Close()
	r.wg.Wait()
	return err
}

func (r *Listener) serve() {
	defer r.wg.Done()
	for {
		c, err := r.l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // a connection reset before it was accepted
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(answerTimeout))
			var b [1]byte
			if n, err := c.Read(b[:]); err == nil && n == 1 {
				_, _ = c.Write(b[:])
			}
		}()
	}
}

// answerTimeout bounds how long the listener waits for a probe's byte.
const answerTimeout = 2 * time.Second

// Probe connects to the listener at host:port, sends a byte and reads it
// back, within timeout (and before ctx ends). It returns nil when the
// byte came back, else what failed.
func Probe(ctx context.Context, host string, port int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("reach %s: %w", addr, err)
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	if _, err := c.Write([]byte{probeByte}); err != nil {
		return fmt.Errorf("reach %s: %w", addr, err)
	}
	var b [1]byte
	if _, err := c.Read(b[:]); err != nil {
		return fmt.Errorf("reach %s: no answer: %w", addr, err)
	}
	if b[0] != probeByte {
		return fmt.Errorf("reach %s: answered %q, not a gorun agent", addr, b[0])
	}
	return nil
}
