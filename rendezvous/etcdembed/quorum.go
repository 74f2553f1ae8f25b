package etcdembed

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
)

// ErrQuorumLost is the cause of a context from UntilQuorumLost that ended
// because the member has had no leader for leaderlessElections election
// timeouts: too few of the cluster's members run (the other nodes' gorun
// stopped theirs) for any write, or any linearizable read, to finish.
var ErrQuorumLost = errors.New("rendezvous: the embedded etcd has had no leader for several election timeouts (too few of its members still run): it can serve no request")

// errMemberStopped is the cause of a context from UntilQuorumLost that
// ended because the member stopped.
var errMemberStopped = errors.New("rendezvous: the embedded etcd member stopped")

// leaderlessElections is how many election timeouts a member must go
// without a leader before UntilQuorumLost calls its quorum lost: a
// cluster that still has a quorum elects a new leader within one or two
// (raft's randomized timeout is 1-2 of them), so an election after a
// leader's loss is not taken for a lost quorum.
const leaderlessElections = 4

// UntilQuorumLost returns a context derived from ctx that ends, with
// cause ErrQuorumLost, once this member has gone leaderlessElections
// election timeouts without a leader: its cluster lost its quorum (or,
// with another cause, once the member stopped). A request to the cluster under the context then fails a few
// election timeouts after the quorum went (raft's CheckQuorum makes a
// leader that hears from no quorum step down), not after its own
// deadline; gorun uses it for what a node does with the etcd as it leaves
// a finished job, when the other nodes may have stopped their members
// already. Otherwise the context ends with ctx or when cancel is called;
// call cancel to release its watch.
func (s *Server) UntilQuorumLost(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	srv := s.etcd.Server
	go func() {
		// etcd notifies a new leader, not the loss of one: look every half
		// election timeout (an atomic load).
		tick := time.NewTicker(s.election / 2)
		defer tick.Stop()
		var since time.Time // when the member was first seen leaderless; zero: it has a leader
		for {
			switch now := time.Now(); {
			case srv.Leader() != types.ID(0):
				since = time.Time{}
			case since.IsZero():
				since = now
			case now.Sub(since) >= leaderlessElections*s.election:
				cancel(ErrQuorumLost)
				return
			}
			select {
			case <-tick.C:
			case <-srv.StopNotify():
				cancel(errMemberStopped)
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}
