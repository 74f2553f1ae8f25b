package testutil

import (
	"fmt"
	"net"
	"testing"
)

// FreePort returns a TCP port of 127.0.0.1 that was free a moment ago, and
// fails t when the kernel gives none. Another process may take the port
// before the caller binds it.
func FreePort(t testing.TB) int {
	t.Helper()
	ports, err := FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return ports[0]
}

// FreePorts returns n distinct TCP ports of 127.0.0.1 that were free a
// moment ago (the kernel chose them, all held open at once so none repeats;
// another process may take one before the caller binds it: retry on
// "address already in use").
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	for len(ports) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("testutil: free port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// SilentPort listens on a free loopback port, accepts every connection
// and never answers on it: to a prober, a node whose packets back never
// arrive. The listener and the connections it took close at t's
// cleanup, which waits for its goroutine.
func SilentPort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var held []net.Conn
		for {
			c, err := l.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return l.Addr().(*net.TCPAddr).Port
}
