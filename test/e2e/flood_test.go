package e2e

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/test/harness"
	"github.com/gorun/gorun/trainer/metrics"
)

// TestGarbageConnectionsLeaveTheJobAlone is issue 11's flood: while a job of 2 workers trains,
// hundreds of connections send garbage (random bytes, a frame header that declares 16 MiB, or
// nothing at all) to every TCP port its workers listen on. The job finishes with a final
// checkpoint bit-identical to an undisturbed run's, and the workers' memory stays bounded.
func TestGarbageConnectionsLeaveTheJobAlone(t *testing.T) {
	toml := trainerToml(t)
	root := t.TempDir()
	refDir := filepath.Join(root, "ref")
	if r := resumeRun(t, "undisturbed", toml, refDir, refDir+".jsonl", 2).wait(); r.ExitCode != 0 {
		t.Fatalf("undisturbed run: exit %d", r.ExitCode)
	}

	dir := filepath.Join(root, "flooded")
	metrics := dir + ".jsonl"
	job := resumeRun(t, "flooded", toml, dir, metrics, 2)
	waitForStep(t, metrics, 2)
	// Paused, the workers cannot finish before the flood has reached them: the kernel queues the
	// garbage connections, and the workers meet all of them once they go on.
	workers := childWorkers(t, job)
	for _, pid := range workers {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	ports := listeningPorts(t, workers)
	if len(ports) == 0 {
		t.Fatal("the workers listen on no TCP port")
	}
	rssBefore := totalRSS(workers)

	stop := make(chan struct{})
	var connected atomic.Int64
	var wg sync.WaitGroup
	const perPort = 100
	for _, port := range ports {
		for i := range perPort {
			wg.Go(func() { flood(port, i, stop, &connected) })
		}
	}
	for connected.Load() < int64(perPort*len(ports)) {
		time.Sleep(5 * time.Millisecond)
	}
	for _, pid := range workers {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
	var rssPeak atomic.Int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			rssPeak.Store(max(rssPeak.Load(), totalRSS(workers)))
			select {
			case <-job.done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	r := job.wait()
	close(stop)
	wg.Wait()
	<-sampled
	if r.ExitCode != 0 {
		t.Fatalf("flooded run: exit %d", r.ExitCode)
	}
	requireEqual(t, refDir, dir)
	t.Logf("%d garbage connections to ports %v; workers' RSS %d MiB before, at most %d MiB during the flood",
		connected.Load(), ports, rssBefore>>20, rssPeak.Load()>>20)
	if peak := rssPeak.Load(); peak > rssBefore+256<<20 {
		t.Errorf("the workers grew from %d MiB to %d MiB under the flood", rssBefore>>20, peak>>20)
	}
}

// flood connects to port again and again until stop, each time sending one kind of garbage
// (picked by kind) and waiting for the worker to close the connection; it counts connections.
func flood(port, kind int, stop <-chan struct{}, connected *atomic.Int64) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
		if err != nil {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		connected.Add(1)
		switch kind % 4 {
		case 0: // random bytes
			junk := make([]byte, 4096)
			_, _ = rand.Read(junk)
			_, _ = c.Write(junk)
		case 1: // a length prefix that declares 16 MiB, then little
			_, _ = c.Write(append([]byte{0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01}, bytes.Repeat([]byte{0xff}, 64)...))
		case 2: // text
			_, _ = c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
		case 3: // nothing: hold a handshake slot until the worker gives up
		}
		_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
		go func() { <-stop; _ = c.Close() }()
		_, _ = c.Read(make([]byte, 1))
		_ = c.Close()
	}
}

// waitForStep waits until the metrics file has a record of step or later.
func waitForStep(t *testing.T, path string, step int) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		recs, _ := metrics.ReadFile(path) // every record, a step redone included
		for _, r := range recs {
			if r.Step >= step {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%s: no step %d within 90 s", path, step)
}

// childWorkers are the pids of the worker processes gorun p started.
func childWorkers(t *testing.T, p *gorunProc) []int {
	t.Helper()
	var pids []int
	for _, w := range harness.Marked(markerEnv + "=" + p.marker) {
		if w.PPID == p.cmd.Process.Pid {
			pids = append(pids, w.PID)
		}
	}
	if len(pids) == 0 {
		t.Fatalf("%s: no worker process", p.name)
	}
	return pids
}

// listeningPorts are the TCP ports the processes pids listen on (IPv4 and IPv6).
func listeningPorts(t *testing.T, pids []int) []int {
	t.Helper()
	inodes := map[string]bool{}
	for _, pid := range pids {
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if inode, ok := strings.CutPrefix(link, "socket:["); ok && err == nil {
				inodes[strings.TrimSuffix(inode, "]")] = true
			}
		}
	}
	seen := map[int]bool{}
	var ports []int
	for _, table := range []string{"tcp", "tcp6"} {
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pids[0], table))
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" || !inodes[f[9]] { // 0A: LISTEN
				continue
			}
			_, hexPort, _ := strings.Cut(f[1], ":")
			port, err := strconv.ParseInt(hexPort, 16, 32)
			if err == nil && !seen[int(port)] {
				seen[int(port)] = true
				ports = append(ports, int(port))
			}
		}
	}
	return ports
}

// totalRSS is the resident memory of the processes pids, in bytes (0 for those gone).
func totalRSS(pids []int) int64 {
	var total int64
	for _, pid := range pids {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				total += kb << 10
			}
		}
	}
	return total
}
