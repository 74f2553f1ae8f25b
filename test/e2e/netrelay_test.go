package e2e

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/testutil"
)

// netRelay is a host's link to the netLab bridge with this process in the middle, for delay
// where the kernel has no netem: two TAP devices, "eth0" in the host's namespace and a port of
// br0 in the bridge namespace, and one goroutine per direction that reads Ethernet frames from
// one and writes them to the other. It promises:
//
//   - a frame is written no sooner than the delay (SetDelay) after it was read, and the frames
//     of one direction leave in the order they came (a frame read while the delay was longer
//     holds back the ones behind it, as on a real link);
//   - with delay 0 a frame is written as soon as it is read;
//   - at most relayQueue frames wait per direction; a frame read when the queue is full is
//     dropped, as by a switch whose buffer is full;
//   - Close closes both TAPs (the kernel deletes a TAP when its last file closes) and returns
//     once every goroutine of the relay has.
//
// Loss is left to the lab's nft rules, which see the relay's frames on the bridge like any
// other port's.
type netRelay struct {
	delay atomic.Int64 // nanoseconds
	host  *os.File     // the TAP in the host's namespace
	port  *os.File     // the TAP on the bridge
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

// relayQueue is how many frames may wait in one direction of a netRelay: 100 ms of the
// netfault job's traffic, with room to spare.
const relayQueue = 8192

// relayFrame is a frame and when it may leave.
type relayFrame struct {
	due time.Time
	b   []byte
}

// newNetRelay makes a TAP named hostDev in the namespace hostNS and one named portDev in the
// namespace portNS (both names under /var/run/netns), and starts relaying between them with
// delay 0. The devices are down and without addresses: the caller sets them up.
func newNetRelay(hostNS, hostDev, portNS, portDev string) (*netRelay, error) {
	r := &netRelay{done: make(chan struct{})}
	var err error
	if r.host, err = openTap(hostNS, hostDev); err != nil {
		return nil, err
	}
	if r.port, err = openTap(portNS, portDev); err != nil {
		return nil, errors.Join(err, r.host.Close())
	}
	r.pipe(r.host, r.port)
	r.pipe(r.port, r.host)
	return r, nil
}

// SetDelay makes every frame read from now on wait d before it is written.
func (r *netRelay) SetDelay(d time.Duration) { r.delay.Store(int64(d)) }

// Close stops the relay: it closes both TAPs, which ends the readers, stops the writers
// (frames still waiting are dropped) and waits for all four goroutines. A second Close does
// nothing.
func (r *netRelay) Close() error {
	var err error
	r.once.Do(func() {
		close(r.done)
		err = errors.Join(r.host.Close(), r.port.Close())
		r.wg.Wait()
	})
	return err
}

// pipe relays frames from one TAP to the other: a reader that stamps each frame with its due
// time and queues it, and a writer that sends the queue's frames in order, each when it is due.
func (r *netRelay) pipe(from, to *os.File) {
	q := make(chan relayFrame, relayQueue)
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		defer close(q)
		buf := make([]byte, 1<<16)
		for {
			n, err := from.Read(buf)
			if err != nil {
				return // closed (Close), or the device went with its namespace
			}
			f := relayFrame{due: time.Now().Add(time.Duration(r.delay.Load())), b: append([]byte(nil), buf[:n]...)}
			select {
			case q <- f:
			default: // full: drop it
			}
		}
	}()
	go func() {
		defer r.wg.Done()
		t := time.NewTimer(0)
		defer t.Stop()
		for f := range q {
			if wait := time.Until(f.due); wait > 0 {
				t.Reset(wait)
				select {
				case <-t.C:
				case <-r.done:
					return
				}
			}
			// A frame the kernel refuses (the device down, or closed by Close) is lost, as on a
			// wire; the reader ends the relay when the file is closed.
			_, _ = to.Write(f.b)
		}
	}()
}

// openTap creates the TAP device name (Ethernet frames, no packet information header) in the
// network namespace ns and returns its file, non-blocking so that Close ends a Read.
func openTap(ns, name string) (*os.File, error) {
	var f *os.File
	err := inNetns(ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(name)
		if err == nil {
			ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
			err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		}
		if err == nil {
			err = unix.SetNonblock(fd, true)
		}
		if err != nil {
			_ = unix.Close(fd)
			return fmt.Errorf("TAP %s: %w", name, err)
		}
		f = os.NewFile(uintptr(fd), "tap "+ns+"/"+name)
		return nil
	})
	return f, err
}

// inNetns runs fn on an OS thread in the network namespace ns (a name under /var/run/netns):
// what fn creates there (a device, a socket) stays in ns. It runs fn on a goroutine of its own
// that holds its thread; the thread goes back to the process's namespace afterwards, and one
// that cannot is never unlocked, so Go ends it with the goroutine.
func inNetns(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer self.Close()
		target, err := os.Open(filepath.Join("/var/run/netns", ns))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		err = fn()
		if back := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); back != nil {
			errc <- errors.Join(err, fmt.Errorf("setns back from %s: %w", ns, back))
			return // still locked: the thread exits with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// requireTun skips t unless this process can create TAP devices (/dev/net/tun opens; under
// CI=true it fails t instead).
func requireTun(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
	if err != nil {
		testutil.SkipOrFail(t, "a netRelay needs TAP devices: %v (modprobe tun)", err)
	}
	f.Close()
}

// TestNetRelay sends UDP echoes from host a to host b, whose link is a relay: at delay 0 they
// come back, at 100 ms each round trip takes at least 200 ms (the request and the reply each
// cross b's relay once), and back at 0 they come back fast again.
func TestNetRelay(t *testing.T) {
	requireNetLab(t)
	requireTun(t)
	lab := newNetLab(t, []string{"a", "b"}, withRelay("b"))

	var echo, client net.PacketConn
	if err := inNetns(lab.ns["b"], func() (err error) {
		echo, err = net.ListenPacket("udp4", lab.Addr("b")+":7")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { echo.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := echo.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = echo.WriteTo(buf[:n], from)
		}
	}()
	if err := inNetns(lab.ns["a"], func() (err error) {
		client, err = net.ListenPacket("udp4", lab.Addr("a")+":0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	to := &net.UDPAddr{IP: net.ParseIP(lab.Addr("b")), Port: 7}

	// rtts sends n echoes one after the other and returns each round trip.
	rtts := func(n int) []time.Duration {
		t.Helper()
		var out []time.Duration
		buf := make([]byte, 64)
		for i := range n {
			msg := fmt.Sprint("echo ", i)
			start := time.Now()
			if _, err := client.WriteTo([]byte(msg), to); err != nil {
				t.Fatal(err)
			}
			if err := client.SetReadDeadline(start.Add(5 * time.Second)); err != nil {
				t.Fatal(err)
			}
			for {
				k, _, err := client.ReadFrom(buf)
				if err != nil {
					t.Fatalf("echo %d: %v", i, err)
				}
				if string(buf[:k]) == msg {
					break
				}
			}
			out = append(out, time.Since(start))
		}
		return out
	}

	fast := func(what string) {
		got := rtts(5)
		t.Logf("%s: round trips %v", what, got)
		if m := slices.Min(got); m >= 100*time.Millisecond {
			t.Errorf("%s: the fastest of 5 round trips took %v, want well under the 100 ms delay", what, m)
		}
	}
	fast("delay 0")
	lab.Delay("b", 100*time.Millisecond)
	got := rtts(5)
	t.Logf("delay 100 ms: round trips %v", got)
	if m := slices.Min(got); m < 200*time.Millisecond {
		t.Errorf("delay 100 ms: a round trip took %v, want at least 200 ms", m)
	}
	lab.Heal()
	fast("healed")
}
