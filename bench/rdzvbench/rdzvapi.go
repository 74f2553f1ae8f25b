package main

// This file is the only one of rdzvbench that imports gorun's rendezvous
// package: when its API moves (package split, renames), only this file
// changes. The rest of the bench sees agents, rounds and counters.

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdembed"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// round is what one agent got from a round: rendezvous.Round.
type round = rendezvous.Round

// limits are a job's node bounds (--nnodes MIN:MAX) and how many
// membership changes it may restart after (max_membership_changes).
type limits struct{ Min, Max, Changes int }

// dialEtcd returns a client of the etcd at endpoint, once it answered.
func dialEtcd(ctx context.Context, endpoint string) (*clientv3.Client, error) {
	return etcdstore.Dial(ctx, etcdstore.ClientConfig{Endpoints: []string{endpoint}, Patience: 10 * time.Second})
}

// nodesPrefix is the etcd prefix of the node keys (one leased key per live
// agent) of the first incarnation of job runID.
func nodesPrefix(runID string) string {
	return etcdstore.Incarnation{RunID: runID}.Prefix() + "nodes/"
}

// agentSpec says how to start one in-process agent.
type agentSpec struct {
	Endpoint string
	RunID    string
	ID       string // unique in the job; also its host name
	Limits   limits
	LastCall time.Duration
	TTL      time.Duration
	Counts   *storeCounts // summed over the agents of a case
}

// agent is one in-process agent: its own etcd client, lease (session),
// watch and view, as one gorun agent process has.
type agent struct {
	client *clientv3.Client
	rdzv   *rendezvous.Elastic
	view   *viewCounts // what this agent's watches delivered
}

// startAgent dials etcd, opens a session and joins the job.
func startAgent(ctx context.Context, spec agentSpec) (*agent, error) {
	cli, err := dialEtcd(ctx, spec.Endpoint)
	if err != nil {
		return nil, err
	}
	a := &agent{client: cli, view: &viewCounts{}}
	store, err := etcdstore.NewConn(cli).NewStore(ctx, etcdstore.Incarnation{RunID: spec.RunID}, spec.TTL)
	if err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("%s: session: %w", spec.ID, err)
	}
	a.rdzv, err = rendezvous.Join(ctx, countingStore{store, spec.Counts, a.view}, rendezvous.Config{
		Self:     rendezvous.Member{ID: spec.ID, Host: spec.ID, Addr: "127.0.0.1", Preferred: -1, NProc: 1},
		Limits:   rendezvous.Limits{MinNodes: spec.Limits.Min, MaxNodes: spec.Limits.Max, MaxChanges: spec.Limits.Changes},
		LastCall: spec.LastCall, JoinTimeout: spec.LastCall + time.Hour, // the caller's ctx bounds Next
		LeaseTTL: spec.TTL,
		FreePort: freePort, Log: zerolog.Nop(),
	})
	if err != nil {
		_ = store.Close()
		_ = cli.Close()
		return nil, fmt.Errorf("%s: join: %w", spec.ID, err)
	}
	return a, nil
}

// next blocks until this agent has its next round, or ctx ends.
func (a *agent) next(ctx context.Context) (round, error) { return a.rdzv.Next(ctx) }

// roundEnded returns a channel that closes when round r ended for this
// agent (a member left, or the job closed), or ctx ended.
func (a *agent) roundEnded(ctx context.Context, r round) <-chan struct{} {
	ended := make(chan struct{})
	ends := a.rdzv.Watch(ctx, r)
	go func() {
		defer close(ended)
		for range ends {
		}
	}()
	return ended
}

// die closes the agent's etcd client without releasing its lease, as a
// node that loses power: its keys stay until the lease expires.
func (a *agent) die() { _ = a.client.Close() }

// close leaves the job (releasing the lease) and closes the client.
func (a *agent) close() {
	if a.rdzv != nil {
		_ = a.rdzv.Close()
	}
	_ = a.client.Close()
}

// viewCounts is what one agent's store watches delivered to it, how often
// it listed a key or prefix of the job, and how many watches it opened.
// An agent that is not the aggregator lists and watches each key it
// follows once (docs/design.md: three exact keys), unless a watch breaks.
type viewCounts struct {
	Events, Lists, Watches atomic.Int64
}

// storeCounts counts what the agents of one case asked of etcd, summed
// over agents.
type storeCounts struct {
	Lists, Watches, Events, Puts, Deletes atomic.Int64
	CAS, CASWon                           atomic.Int64
	CASBytes                              atomic.Int64
}

// String is one line of the counts.
func (c *storeCounts) String() string {
	return fmt.Sprintf("lists %d, watches %d, events %d, puts %d, deletes %d, cas %d (won %d, %d KiB sent)",
		c.Lists.Load(), c.Watches.Load(), c.Events.Load(), c.Puts.Load(), c.Deletes.Load(), c.CAS.Load(), c.CASWon.Load(), c.CASBytes.Load()>>10)
}

// countingStore is a rendezvous.Store that counts its calls into counts
// (all agents) and the events delivered on its watch channels into view
// (this agent).
type countingStore struct {
	rendezvous.Store
	counts *storeCounts
	view   *viewCounts
}

func (s countingStore) List(ctx context.Context, prefix string, limit int) ([]rendezvous.KV, int64, error) {
	s.counts.Lists.Add(1)
	s.view.Lists.Add(1)
	return s.Store.List(ctx, prefix, limit)
}

func (s countingStore) Txn(ctx context.Context, guard string, rev int64, writes ...rendezvous.KV) (bool, error) {
	s.counts.CAS.Add(1)
	for _, w := range writes {
		s.counts.CASBytes.Add(int64(len(w.Value)))
	}
	won, err := s.Store.Txn(ctx, guard, rev, writes...)
	if won {
		s.counts.CASWon.Add(1)
	}
	return won, err
}

func (s countingStore) Put(ctx context.Context, key string, value []byte, leased bool) error {
	s.counts.Puts.Add(1)
	return s.Store.Put(ctx, key, value, leased)
}

func (s countingStore) Delete(ctx context.Context, key string) error {
	s.counts.Deletes.Add(1)
	return s.Store.Delete(ctx, key)
}

// Watch counts each event as it is handed to the protocol, on every watch
// the agent opens (whatever the prefix).
func (s countingStore) Watch(ctx context.Context, prefix string, rev int64) <-chan rendezvous.Event {
	s.counts.Watches.Add(1)
	s.view.Watches.Add(1)
	in := s.Store.Watch(ctx, prefix, rev)
	out := make(chan rendezvous.Event)
	go func() {
		defer close(out)
		for ev := range in {
			select {
			case out <- ev:
				s.counts.Events.Add(1)
				s.view.Events.Add(1)
			case <-ctx.Done():
				// Drain so the inner watch's goroutine can end.
				for range in {
				}
				return
			}
		}
	}()
	return out
}

// etcdStatus is etcd's own account of its database.
type etcdStatus struct {
	DBBytes, DBInUseBytes int64
	Revision              int64
}

// readEtcdStatus asks the etcd at endpoint for its database size.
func readEtcdStatus(ctx context.Context, cli *clientv3.Client, endpoint string) (etcdStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.Status(ctx, endpoint)
	if err != nil {
		return etcdStatus{}, fmt.Errorf("etcd status: %w", err)
	}
	return etcdStatus{DBBytes: resp.DbSize, DBInUseBytes: resp.DbSizeInUse, Revision: resp.Header.Revision}, nil
}

// liveLeases says how many leases etcd holds now: after a lost session,
// fewer than the agents means etcd itself expired leases (no keep-alive
// reached it within the TTL).
func liveLeases(ctx context.Context, endpoint string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cli, err := dialEtcd(ctx, endpoint)
	if err != nil {
		return "leases: " + err.Error()
	}
	defer cli.Close()
	resp, err := cli.Leases(ctx)
	if err != nil {
		return "leases: " + err.Error()
	}
	return fmt.Sprintf("etcd holds %d leases", len(resp.Leases))
}

// watchNodeDeletes reports on the returned channel the time of the first
// deletion of a node key of job runID after now (a lease expired or was
// released). It stops when ctx ends.
func watchNodeDeletes(ctx context.Context, cli *clientv3.Client, runID string) (<-chan time.Time, error) {
	prefix := nodesPrefix(runID)
	nodes, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	deleted := make(chan time.Time, 1)
	wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(nodes.Header.Revision+1), clientv3.WithFilterPut())
	go func() {
		for resp := range wch {
			if len(resp.Events) > 0 {
				deleted <- time.Now()
				return
			}
		}
	}()
	return deleted, nil
}

// countNodes returns how many node keys (live agents) job runID has.
func countNodes(ctx context.Context, cli *clientv3.Client, runID string) (int64, error) {
	resp, err := cli.Get(ctx, nodesPrefix(runID), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Count, nil
}

// runEmbeddedEtcd runs one embedded etcd member on 127.0.0.1 (fsync on,
// as a job's embedded member runs) with its data under dir, writes its
// client endpoint to endpointFile once it serves, and returns when ctx
// ends or the member fails.
func runEmbeddedEtcd(ctx context.Context, dir, endpointFile string, log zerolog.Logger) error {
	var server *etcdembed.Server
	var lastErr error
	for try := 0; try < 5 && server == nil; try++ {
		p, err := freePortPair()
		if err != nil {
			return err
		}
		server, lastErr = etcdembed.Start(ctx, etcdembed.Config{
			Name:          "bench",
			DataDir:       filepath.Join(dir, fmt.Sprintf("etcd-%d", p)),
			RemoveDataDir: true,
			ClientAddr:    net.JoinHostPort("127.0.0.1", strconv.Itoa(p)),
			PeerAddr:      net.JoinHostPort("127.0.0.1", strconv.Itoa(p+1)),
			Log:           log,
		})
		if lastErr != nil && !strings.Contains(lastErr.Error(), "address already in use") {
			return lastErr
		}
	}
	if server == nil {
		return lastErr
	}
	defer server.Close()
	if err := writeAtomically(endpointFile, server.Endpoints()[0]+"\n"); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-server.Err():
		return fmt.Errorf("etcd: %w", err)
	}
}
