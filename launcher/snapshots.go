package launcher

import (
	"context"
	"maps"
	"net"
	"slices"
	"sync"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/internal/snapshot"
	"github.com/gorun/gorun/internal/snapshot/replica"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/status"
)

// replicaPurpose is what the job secret's key for snapshot replication
// is derived for (jobsecret.Secret.Key).
const replicaPurpose = "snapshot-replica"

// replicaTransfer is elastic.Transfer over internal/snapshot/replica: this
// node's server, and fetches and pushes with the job's credentials.
type replicaTransfer struct {
	*replica.Server
	auth replica.Auth
}

// Fetch is replica.Fetch with the job's credentials.
func (t replicaTransfer) Fetch(ctx context.Context, addr string, rank int, step uint64, dst *snapshot.RankSlots) error {
	return replica.Fetch(ctx, addr, t.auth, rank, step, dst)
}

// Push is replica.Push with the job's credentials.
func (t replicaTransfer) Push(ctx context.Context, round int, dir string, ranks []int, peers []string, sent func(rank int, step uint64, peer string)) error {
	return replica.Push(ctx, round, dir, ranks, peers, t.auth, sent)
}

// serveReplicas starts this node's replica server on its address (a free
// port), serving dir: the other nodes push their ranks' snapshots to it
// and fetch from it what their ranks lack.
func (n *node) serveReplicas(dir string) (replicaTransfer, error) {
	l := n.l
	auth := replica.Auth{RunID: l.RunID}
	if !l.Secret.IsZero() {
		auth.Secret = l.Secret.Key(replicaPurpose)
	}
	srv, err := replica.Serve(net.JoinHostPort(l.Addr, "0"), dir, auth, n.rt.Log)
	if err != nil {
		return replicaTransfer{}, err
	}
	return replicaTransfer{Server: srv, auth: auth}, nil
}

// snapshotStatus is this node's snapshots as gorun status shows them
// (status.Snapshots), fed by the agent's observer and published with the
// node's stats. A nil *snapshotStatus records nothing and has none. It is
// safe for concurrent use.
type snapshotStatus struct {
	dir string

	mu       sync.Mutex
	ranks    map[int]bool              // this node's ranks in its current round
	replicas map[int]map[string]uint64 // rank -> peer -> newest step copied there, this round
	recovery *status.SnapshotRecovery
}

func newSnapshotStatus(dir string) *snapshotStatus {
	return &snapshotStatus{dir: dir, ranks: map[int]bool{}, replicas: map[int]map[string]uint64{}}
}

func (s *snapshotStatus) roundStarted() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.ranks)
}

func (s *snapshotStatus) workerStarted(rank int) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ranks[rank] = true
}

func (s *snapshotStatus) agreed(r rendezvous.Round, rec elastic.SnapshotRecovery) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.replicas)
	if rec.Held {
		s.recovery = &status.SnapshotRecovery{Round: r.Number, Restored: rec.Restored, Step: rec.Step, Newest: rec.Newest,
			Redone: rec.Redone(), Reason: rec.Reason}
	}
}

func (s *snapshotStatus) replicated(rank int, step uint64, peer string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.replicas[rank] == nil {
		s.replicas[rank] = map[string]uint64{}
	}
	s.replicas[rank][peer] = max(s.replicas[rank][peer], step)
}

// status is what to publish now: each current rank's newest step (its
// slot headers) with its copies, and the last recovery; nil when there is
// nothing yet.
func (s *snapshotStatus) status() *status.Snapshots {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &status.Snapshots{Recovery: s.recovery}
	ranks := slices.Sorted(maps.Keys(s.ranks))
	for _, rank := range ranks {
		step, ok := snapshot.NewestHeader(s.dir, rank)
		if !ok {
			continue
		}
		rs := status.RankSnapshot{Rank: rank, Step: step}
		for _, peer := range slices.Sorted(maps.Keys(s.replicas[rank])) {
			rs.Replicas = append(rs.Replicas, status.Replica{Peer: peer, Step: s.replicas[rank][peer]})
		}
		out.Ranks = append(out.Ranks, rs)
	}
	if len(out.Ranks) == 0 && out.Recovery == nil {
		return nil
	}
	return out
}
