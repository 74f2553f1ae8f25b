package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// markerEnv is set in the environment of every process the bench starts (and so of their
// workers): the cleanup finds and kills what is left by it, whoever the parent was.
const markerEnv = "CHAOS_BENCH_MARKER"

// etcdMember is one `gorun rendezvous serve` member of the bench's three-member etcd.
type etcdMember struct {
	name, client, peer, dataDir string
	cmd                         *exec.Cmd
	done                        chan struct{}
}

// cluster is the bench's etcd: three members on 127.0.0.1, one per node slot 0-2 ("hosted"
// by that slot's node, as the first three nodes of a SLURM step host the embedded members).
type cluster struct {
	b       *bench
	members []*etcdMember
	client  *clientv3.Client
}

// freePorts returns n distinct free TCP ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startCluster starts the three members and waits for a client to reach them.
func startCluster(ctx context.Context, b *bench) (*cluster, error) {
	ports, err := freePorts(6)
	if err != nil {
		return nil, err
	}
	c := &cluster{b: b}
	var initial []string
	for i := range 3 {
		m := &etcdMember{name: fmt.Sprintf("e%d", i), client: fmt.Sprintf("127.0.0.1:%d", ports[2*i]),
			peer: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1]), dataDir: filepath.Join(b.dir, "etcd", fmt.Sprintf("e%d", i))}
		c.members = append(c.members, m)
		initial = append(initial, m.name+"="+m.peer)
	}
	for _, m := range c.members {
		if err := c.start(m, strings.Join(initial, ",")); err != nil {
			return nil, err
		}
	}
	c.client, err = clientv3.New(clientv3.Config{Endpoints: c.endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := c.client.Get(cctx, "health")
		cancel()
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("etcd: no answer from %v within 60 s: %w", c.endpoints(), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// initialCluster is the --initial-cluster of every member.
func (c *cluster) initialCluster() string {
	var s []string
	for _, m := range c.members {
		s = append(s, m.name+"="+m.peer)
	}
	return strings.Join(s, ",")
}

// start starts member m (again: its data dir is kept, so a restart resumes it).
func (c *cluster) start(m *etcdMember, initial string) error {
	log, err := os.OpenFile(filepath.Join(c.b.dir, "logs", m.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.b.gorun, "rendezvous", "serve", "--name", m.name, "--listen", m.client, "--peer-listen", m.peer,
		"--data-dir", m.dataDir, "--initial-cluster", initial)
	cmd.Env = append(os.Environ(), markerEnv+"="+c.b.marker)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("etcd member %s: %w", m.name, err)
	}
	m.cmd, m.done = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(m.done)
	}()
	return nil
}

// alive reports whether member m's process runs.
func (m *etcdMember) alive() bool {
	if m.cmd == nil {
		return false
	}
	select {
	case <-m.done:
		return false
	default:
		return true
	}
}

// endpoints are the members' client addresses.
func (c *cluster) endpoints() []string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.client)
	}
	return eps
}

// leaderMember is the index of the member that is etcd's raft leader now.
func (c *cluster) leaderMember(ctx context.Context) (int, error) {
	for i, m := range c.members {
		if !m.alive() {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := c.client.Status(cctx, m.client)
		cancel()
		if err != nil || st.Leader == 0 {
			continue
		}
		if st.Leader == st.Header.MemberId {
			return i, nil
		}
	}
	return -1, errors.New("no etcd member says it is the leader")
}

// aggregatorPid is the pid of the agent that holds the job's leader key (its node id is
// <node name>.<pid>).
func (c *cluster) aggregatorPid(ctx context.Context, runID string) (int, error) {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	in, ok, err := etcdstore.NewConn(c.client).ReadCurrent(cctx, runID)
	if err != nil || !ok {
		return 0, fmt.Errorf("reading run %s's incarnation: started %v: %v", runID, ok, err)
	}
	resp, err := c.client.Get(cctx, in.Prefix()+"leader")
	if err != nil {
		return 0, err
	}
	if len(resp.Kvs) == 0 {
		return 0, errors.New("no leader key: no aggregator now")
	}
	id := string(resp.Kvs[0].Value)
	i := strings.LastIndexByte(id, '.')
	pid, err := strconv.Atoi(id[i+1:])
	if i < 0 || err != nil {
		return 0, fmt.Errorf("leader key %q: not <node>.<pid>", id)
	}
	return pid, nil
}

// stop ends every member (SIGTERM, then SIGKILL after 10 s) and closes the client.
func (c *cluster) stop() {
	if c.client != nil {
		c.client.Close()
	}
	for _, m := range c.members {
		if m.alive() {
			_ = m.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, m := range c.members {
		if m.cmd == nil {
			continue
		}
		select {
		case <-m.done:
		case <-time.After(10 * time.Second):
			_ = m.cmd.Process.Kill()
			<-m.done
		}
	}
}
