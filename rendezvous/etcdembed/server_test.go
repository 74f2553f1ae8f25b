package etcdembed

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/internal/testutil"
)

// fastServer is a single-member Config on free loopback ports with
// test timings.
// etcd's own servers leave a few goroutines winding down; etcdtest knows which.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.GoleakOptions()...) }

func fastServer(t testing.TB) Config {
	ports, err := etcdtest.FreePorts(2)
	require.NoError(t, err)
	return Config{
		Name:            "m0",
		DataDir:         filepath.Join(t.TempDir(), "etcd"),
		ClientAddr:      "127.0.0.1:" + strconv.Itoa(ports[0]),
		PeerAddr:        "127.0.0.1:" + strconv.Itoa(ports[1]),
		Heartbeat:       10 * time.Millisecond,
		ElectionTimeout: 100 * time.Millisecond,
		StartTimeout:    20 * time.Second,
		UnsafeNoFsync:   true,
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestServerStartClose(t *testing.T) {
	cfg := fastServer(t)
	cfg.RemoveDataDir = true
	s, err := Start(testCtx(t), cfg)
	require.NoError(t, err)
	require.Equal(t, []string{"http://" + cfg.ClientAddr}, s.Endpoints())

	cli := etcdtest.NewClient(t, s.Endpoints()...)
	_, err = cli.Put(testCtx(t), "k", "v")
	require.NoError(t, err)
	resp, err := cli.Get(testCtx(t), "k")
	require.NoError(t, err)
	require.Equal(t, "v", string(resp.Kvs[0].Value))
	require.DirExists(t, cfg.DataDir)

	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "a second Close is safe")
	require.NoDirExists(t, cfg.DataDir, "RemoveDataDir")
	_, err = net.DialTimeout("tcp", cfg.ClientAddr, time.Second)
	require.Error(t, err, "the client port is closed")
}

func TestServerKeepsDataDirAndRestarts(t *testing.T) {
	cfg := fastServer(t)
	s, err := Start(testCtx(t), cfg)
	require.NoError(t, err)
	cli := etcdtest.NewClient(t, s.Endpoints()...)
	_, err = cli.Put(testCtx(t), "k", "kept")
	require.NoError(t, err)
	require.NoError(t, cli.Close())
	require.NoError(t, s.Close())
	require.DirExists(t, cfg.DataDir)

	s, err = Start(testCtx(t), cfg)
	require.NoError(t, err)
	defer s.Close()
	resp, err := etcdtest.NewClient(t, s.Endpoints()...).Get(testCtx(t), "k")
	require.NoError(t, err)
	require.Equal(t, "kept", string(resp.Kvs[0].Value))
}

func TestServerPortInUse(t *testing.T) {
	cfg := fastServer(t)
	l, err := net.Listen("tcp", cfg.ClientAddr)
	require.NoError(t, err)
	defer l.Close()
	_, err = Start(testCtx(t), cfg)
	require.ErrorContains(t, err, "rendezvous: etcd member m0: client port "+cfg.ClientAddr+" is in use by another process")
	require.ErrorIs(t, err, syscall.EADDRINUSE, "callers can tell a taken port (a c10d host falls back to client)")
}

func TestServerStartTimesOutWithoutQuorum(t *testing.T) {
	cfg := fastServer(t)
	ports, err := etcdtest.FreePorts(2)
	require.NoError(t, err)
	cfg.InitialCluster = map[string]string{
		"m0": cfg.PeerAddr,
		"m1": "127.0.0.1:" + strconv.Itoa(ports[0]),
		"m2": "127.0.0.1:" + strconv.Itoa(ports[1]),
	}
	cfg.StartTimeout = 300 * time.Millisecond
	cfg.RemoveDataDir = true
	_, err = Start(testCtx(t), cfg)
	require.ErrorContains(t, err, "rendezvous: etcd member m0 not ready within 300ms (a majority of the 3 members must be up")
	require.NoDirExists(t, cfg.DataDir)
}

func TestServerConfigValidate(t *testing.T) {
	good := Config{Name: "a", DataDir: "/d", ClientAddr: "h:1", PeerAddr: "h:2"}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"good", func(*Config) {}, ""},
		{"no name", func(c *Config) { c.Name = "" }, "empty member name"},
		{"name with =", func(c *Config) { c.Name = "a=b" }, "has '=' or ','"},
		{"no dir", func(c *Config) { c.DataDir = "" }, "empty data dir"},
		{"no port", func(c *Config) { c.ClientAddr = "h" }, `client address "h": want host:port`},
		{"port 0", func(c *Config) { c.PeerAddr = "h:0" }, `peer address "h:0": port must be 1-65535`},
		{"no host", func(c *Config) { c.ClientAddr = ":1" }, "empty host"},
		{"same addr", func(c *Config) { c.PeerAddr = "h:1" }, "client and peer address are both h:1"},
		{"not in cluster", func(c *Config) { c.InitialCluster = map[string]string{"b": "h:2"} }, `initial cluster has no member "a"`},
		{"cluster disagrees", func(c *Config) { c.InitialCluster = map[string]string{"a": "h:3"} }, `says member "a" is at h:3, its peer address is h:2`},
		{"bad member addr", func(c *Config) { c.InitialCluster = map[string]string{"a": "h:2", "b": "x"} }, "initial cluster address of b"},
		{"short election", func(c *Config) { c.ElectionTimeout = 200 * time.Millisecond }, "at least 5 heartbeats"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.edit(&c)
			err := c.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestServerLogsWarningsToZerolog(t *testing.T) {
	var buf bytes.Buffer
	lg := zap.New(zerologCore{log: zerolog.New(&buf).With().Str("component", "etcd").Logger()}).With(zap.String("member", "m0"))
	lg.Info("dropped")
	lg.Warn("slow fsync", zap.Duration("took", time.Second), zap.Int("n", 3))
	lg.Error("lost leader")
	lg.Warn("simple token is not cryptographically signed") // routine: debug
	var closing atomic.Bool
	closing.Store(true)
	zap.New(zerologCore{log: zerolog.New(&buf), closing: &closing}).Error("http: Server closed") // closing: debug
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m))
		lines = append(lines, m)
	}
	require.Len(t, lines, 4, "info is dropped")
	require.Equal(t, map[string]any{"level": "warn", "component": "etcd", "member": "m0", "took": float64(1000), "n": float64(3), "message": "slow fsync"}, lines[0])
	for i, want := range [][2]string{1: {"error", "lost leader"}, 2: {"debug", "simple token is not cryptographically signed"}, 3: {"debug", "http: Server closed"}} {
		if i > 0 {
			require.Equal(t, want[0], lines[i]["level"], want[1])
			require.Equal(t, want[1], lines[i]["message"])
		}
	}
}

func TestResolveIPv4(t *testing.T) {
	ctx := testCtx(t)
	ip, err := ResolveIPv4(ctx, "localhost")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", ip)
	ip, err = ResolveIPv4(ctx, "127.0.100.3")
	require.NoError(t, err)
	require.Equal(t, "127.0.100.3", ip)
}

// memberEnv carries a Config to TestServerMemberProcess.
const memberEnv = "GORUN_TEST_ETCD_MEMBER"

// memberSecretEnv carries its Config.Secret (hex; empty: none).
const memberSecretEnv = "GORUN_TEST_ETCD_SECRET"

// memberScratchEnv, when set, has the member claim its data dir there
// (ClaimDataDir, as a job's gorun does) instead of using Config.DataDir.
const memberScratchEnv = "GORUN_TEST_ETCD_SCRATCH"

// TestServerMemberProcess is not a test: it is the body of the child
// processes TestServerClusterSurvivesMemberLoss starts, one etcd member
// each, serving until its stdin closes.
func TestServerMemberProcess(t *testing.T) {
	spec := os.Getenv(memberEnv)
	if spec == "" {
		t.Skip("runs only as a child of TestServerClusterSurvivesMemberLoss")
	}
	var cfg Config
	if err := json.Unmarshal([]byte(spec), &cfg); err != nil {
		fmt.Println("bad spec:", err)
		os.Exit(3)
	}
	if hex := os.Getenv(memberSecretEnv); hex != "" {
		var err error
		if cfg.Secret, err = jobsecret.Parse(hex); err != nil {
			fmt.Println("bad secret:", err)
			os.Exit(3)
		}
	}
	dir := &DataDir{} // Release of the zero DataDir does nothing
	if scratch := os.Getenv(memberScratchEnv); scratch != "" {
		var err error
		if dir, err = ClaimDataDir(scratch, cfg.Name); err != nil {
			fmt.Println("claim:", err)
			os.Exit(1)
		}
		cfg.DataDir = dir.Path()
	}
	s, err := Start(context.Background(), cfg)
	if err != nil {
		fmt.Println("start:", strings.ReplaceAll(err.Error(), "\n", " "))
		os.Exit(1)
	}
	fmt.Println("ready", s.Endpoints()[0])
	quorum, stop := s.UntilQuorumLost(context.Background())
	defer stop()
	go func() {
		<-quorum.Done()
		if errors.Is(context.Cause(quorum), ErrQuorumLost) {
			fmt.Println(quorumLostLine, s.Endpoints()[0])
		}
	}()
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // EOF when the parent closes stdin
	if err := errors.Join(s.Close(), dir.Release()); err != nil {
		fmt.Println("close:", err)
		os.Exit(1)
	}
	os.Exit(0) // not through TestMain: etcd's peer connections linger in-process
}

// clusterOn returns the configurations of a three-member cluster, one
// member per host, every member on the same pair of ports (free on all
// of hosts), as a job's embedded etcd is placed, with data dirs under
// scratch that Close removes.
func clusterOn(t *testing.T, hosts []string, scratch string) []Config {
	// Below the ephemeral range: the cluster may be started again on the
	// same ports, and between two starts an outgoing connection of any
	// process could take an ephemeral one.
	ports, err := testutil.StablePorts(2, hosts)
	require.NoError(t, err)
	cluster := map[string]string{}
	for _, h := range hosts {
		cluster[h] = net.JoinHostPort(h, strconv.Itoa(ports[1]))
	}
	var cfgs []Config
	for _, h := range hosts {
		cfgs = append(cfgs, Config{
			Name: h, DataDir: filepath.Join(scratch, "etcd-"+h), RemoveDataDir: true,
			ClientAddr: net.JoinHostPort(h, strconv.Itoa(ports[0])), PeerAddr: cluster[h],
			InitialCluster: cluster, ClusterToken: ClusterTokenPrefix + "test",
		})
	}
	return cfgs
}

// memberChild is a member run by TestServerMemberProcess in a child process.
type memberChild struct {
	cmd   *exec.Cmd
	stdin interface{ Close() error }
	out   *bufio.Reader
	done  chan struct{}
	first chan string // the child's first line of output ("ready URL", or why not)
	// quorumLost receives the child's quorumLostLine, if it prints one
	// (UntilQuorumLost ended).
	quorumLost chan string
}

// quorumLostLine starts the line a member child prints when its
// UntilQuorumLost context ends with ErrQuorumLost.
const quorumLostLine = "quorum lost"

// startMembers starts one child process per member of cfgs (with test
// timings and secret), all at once, and returns once each said it is
// ready. Cleanup stops them (closing stdin), killing one that does not
// exit in time.
func startMembers(t *testing.T, cfgs []Config, secret jobsecret.Secret) []*memberChild {
	return startMembersIn(t, cfgs, secret, "")
}

// startMembersIn is startMembers with each member claiming its data dir
// under scratch (ClaimDataDir), as a job's gorun does; "": Config.DataDir.
func startMembersIn(t *testing.T, cfgs []Config, secret jobsecret.Secret, scratch string) []*memberChild {
	children := make([]*memberChild, len(cfgs))
	for i, cfg := range cfgs {
		cfg.Heartbeat, cfg.ElectionTimeout, cfg.UnsafeNoFsync = 50*time.Millisecond, 500*time.Millisecond, true
		cfg.StartTimeout = 20 * time.Second
		spec, err := json.Marshal(cfg)
		require.NoError(t, err)
		cmd := exec.Command(os.Args[0], "-test.run=^TestServerMemberProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), memberEnv+"="+string(spec), memberSecretEnv+"="+secret.Encode(), memberScratchEnv+"="+scratch)
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		c := &memberChild{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout), done: make(chan struct{}),
			first: make(chan string, 1), quorumLost: make(chan string, 1)}
		children[i] = c
		go func() { // the first line goes to first, the rest to the test's output
			line, _ := c.out.ReadString('\n')
			c.first <- line
			for {
				line, err := c.out.ReadString('\n')
				fmt.Print(line)
				if strings.HasPrefix(line, quorumLostLine) {
					select {
					case c.quorumLost <- line:
					default:
					}
				}
				if err != nil {
					break
				}
			}
			_ = c.cmd.Wait()
			close(c.done)
		}()
		t.Cleanup(func() {
			_ = c.stdin.Close()
			select {
			case <-c.done:
			case <-time.After(15 * time.Second):
				_ = c.cmd.Process.Kill()
				<-c.done
			}
		})
	}
	for i, c := range children {
		line := <-c.first
		scheme := "http"
		if !secret.IsZero() {
			scheme = "https"
		}
		require.True(t, strings.HasPrefix(line, "ready "+scheme+"://"+cfgs[i].ClientAddr), "member %d said %q", i, line)
	}
	return children
}

// A three-member embedded cluster on three loopback "nodes", each
// member its own process: SIGKILL one (a node
// crash) and the other two still serve Put and Get.
func TestServerClusterSurvivesMemberLoss(t *testing.T) {
	hosts := []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}
	scratch := t.TempDir()
	cfgs := clusterOn(t, hosts, scratch)

	children := startMembers(t, cfgs, jobsecret.Secret{})
	var endpoints []string
	for _, cfg := range cfgs {
		endpoints = append(endpoints, cfg.ClientAddr)
	}

	cli := etcdtest.NewClient(t, endpoints...)
	ctx := testCtx(t)
	_, err := cli.Put(ctx, "before", "1")
	require.NoError(t, err)

	require.NoError(t, children[0].cmd.Process.Signal(syscall.SIGKILL))
	<-children[0].done

	// A request that reached the dead leader is lost: etcd answers it
	// "request timed out" after its request timeout, so retry, as the
	// rendezvous does.
	require.Eventually(t, func() bool {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := cli.Put(actx, "after", "2")
		return err == nil
	}, 20*time.Second, 10*time.Millisecond)
	resp, err := cli.Get(ctx, "", clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 2)

	// A member that is only killed keeps its data dir; closed ones remove theirs.
	for i := 1; i < 3; i++ {
		require.NoError(t, children[i].stdin.Close())
		<-children[i].done
		require.Equal(t, 0, children[i].cmd.ProcessState.ExitCode())
	}
	entries, err := os.ReadDir(scratch)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, "etcd-127.0.0.1", entries[0].Name())
}

// TestServerUntilQuorumLost: three members, each its own process,
// watching its quorum (UntilQuorumLost). A follower is killed: the other
// two still serve a write and neither calls its quorum lost (no election
// happened, so none can have been taken for a loss). Then the second of
// the survivors is killed: the last member, alone, calls its quorum lost
// by itself.
func TestServerUntilQuorumLost(t *testing.T) {
	hosts := []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}
	cfgs := clusterOn(t, hosts, t.TempDir())
	children := startMembers(t, cfgs, jobsecret.Secret{})
	ctx := testCtx(t)

	// Which member leads: kill a follower, so that no election follows.
	leader := -1
	for i, cfg := range cfgs {
		cli := etcdtest.NewClient(t, cfg.ClientAddr)
		st, err := cli.Status(ctx, cfg.ClientAddr)
		require.NoError(t, err)
		if st.Header.MemberId == st.Leader {
			leader = i
		}
	}
	require.GreaterOrEqual(t, leader, 0, "no member says it leads")
	follower, last := (leader+1)%3, (leader+2)%3
	t.Logf("leader %s, killing follower %s, then the leader; %s is left", hosts[leader], hosts[follower], hosts[last])
	require.NoError(t, children[follower].cmd.Process.Signal(syscall.SIGKILL))
	<-children[follower].done

	cli := etcdtest.NewClient(t, cfgs[leader].ClientAddr, cfgs[last].ClientAddr)
	_, err := cli.Put(ctx, "after-a-follower-died", "1")
	require.NoError(t, err, "two members of three are a quorum")
	for _, i := range []int{leader, last} {
		select {
		case line := <-children[i].quorumLost:
			t.Fatalf("member %d called its quorum lost with two members of three running: %s", i, line)
		default:
		}
	}

	require.NoError(t, children[leader].cmd.Process.Signal(syscall.SIGKILL))
	<-children[leader].done
	select {
	case line := <-children[last].quorumLost:
		t.Logf("the last member: %s", strings.TrimSpace(line))
	case <-ctx.Done():
		t.Fatal("the last member of three, alone, never called its quorum lost")
	}
}
