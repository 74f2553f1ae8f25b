package testutil

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
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

// lowestStablePort is where StablePorts begins to look: above the
// well-known and registered services a test machine may run.
const lowestStablePort = 10000

// StablePorts returns n distinct TCP ports, each free on every one of
// hosts a moment ago, chosen at random below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range). A test that binds the same ports again
// and again (a cluster restarted on its names and ports, as a requeued job
// is) needs them: between two binds, an ephemeral port may become the
// source port of any outgoing connection on the machine, and the next bind
// then fails with "address already in use"; a port below the range never
// does. Another test may still choose the same port (one chance in
// thousands). It returns an error when the range leaves no room below it
// or no such ports were found in 100 tries.
func StablePorts(n int, hosts []string) ([]int, error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return nil, fmt.Errorf("testutil: stable ports: %w", err)
	}
	var low, high int
	if _, err := fmt.Sscan(string(b), &low, &high); err != nil {
		return nil, fmt.Errorf("testutil: stable ports: ip_local_port_range %q: %w", b, err)
	}
	if low-lowestStablePort < 100*n {
		return nil, fmt.Errorf("testutil: stable ports: the ephemeral range starts at %d, too close to %d", low, lowestStablePort)
	}
	for range 100 {
		ports := make([]int, 0, n)
		for len(ports) < n {
			p := lowestStablePort + rand.IntN(low-lowestStablePort)
			if !slices.Contains(ports, p) {
				ports = append(ports, p)
			}
		}
		if freeOn(hosts, ports) {
			return ports, nil
		}
	}
	return nil, fmt.Errorf("testutil: stable ports: no %d ports free on %v below %d in 100 tries", n, hosts, low)
}

// freeOn says whether every port is free on every host.
func freeOn(hosts []string, ports []int) bool {
	for _, h := range hosts {
		for _, port := range ports {
			l, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(port)))
			if err != nil {
				return false
			}
			_ = l.Close()
		}
	}
	return true
}
