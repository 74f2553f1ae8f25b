package launcher

import (
	"context"
	"net"

	"github.com/gorun/gorun/internal/snapshot"
	"github.com/gorun/gorun/internal/snapshot/replica"
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
