package etcdtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testutil"
)

// DebianEtcd is where Debian's etcd-server package installs etcd (3.4).
const DebianEtcd = "/usr/bin/etcd"

// debianStopGrace is how long Close waits after SIGTERM before SIGKILL.
const debianStopGrace = 5 * time.Second

// StartDebian starts Debian's etcd (/usr/bin/etcd, package etcd-server)
// as one member on free 127.0.0.1 ports with a temporary data dir and no
// ETCD_* variables in its environment (etcd 3.4 exits when one repeats a
// flag), and returns once it answers a client. Close, or t's cleanup,
// stops it (SIGTERM, SIGKILL after 5 s) and reaps it. Without the binary
// the test is skipped, or fails when CI=true.
func StartDebian(t testing.TB) *Server {
	t.Helper()
	if _, err := os.Stat(DebianEtcd); err != nil {
		testutil.SkipOrFail(t, "etcdtest: %s missing: install Debian's etcd-server (scripts/test.sh does)", DebianEtcd)
	}
	var lastErr error
	for try := 0; try < startTries; try++ {
		s, log, err := startDebian(t, try)
		if err == nil {
			t.Cleanup(func() { _ = s.Close() })
			return s
		}
		lastErr = err
		if !strings.Contains(log, "address already in use") {
			break
		}
	}
	t.Fatalf("etcdtest: start %s: %v", DebianEtcd, lastErr)
	return nil
}

// startDebian makes one attempt; on failure it returns the log too.
func startDebian(t testing.TB, try int) (*Server, string, error) {
	ports, err := FreePorts(2)
	if err != nil {
		return nil, "", err
	}
	dir := filepath.Join(t.TempDir(), "etcd-"+strconv.Itoa(try))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", err
	}
	logPath := filepath.Join(dir, "etcd.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, "", err
	}
	defer logFile.Close()
	client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	cmd := exec.Command(DebianEtcd,
		"--name", "debian", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "debian="+peer, "--initial-cluster-state", "new",
		"--initial-cluster-token", "etcdtest-"+strconv.Itoa(ports[0]),
		"--heartbeat-interval", strconv.Itoa(tickMs), "--election-timeout", strconv.Itoa(electionMs),
		"--logger", "zap", "--log-outputs", "stderr") // 3.4 has no --unsafe-no-fsync
	cmd.Env = withoutEtcdVars(os.Environ())
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, and SIGKILL if the test binary dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	stop := func() error {
		select {
		case <-exited:
			return nil
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			return nil
		case <-time.After(debianStopGrace):
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		return errors.New("etcdtest: debian etcd ignored SIGTERM; killed")
	}
	if err := waitServing(client, readyTimeout, exited); err != nil {
		_ = stop()
		log := readTail(logPath)
		return nil, log, fmt.Errorf("%w; its log ends:\n%s", err, log)
	}
	return &Server{name: "debian", endpoints: []string{client}, stop: stop}, "", nil
}

func withoutEtcdVars(environ []string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "ETCD_") {
			out = append(out, kv)
		}
	}
	return out
}

func readTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}
