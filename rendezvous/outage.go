package rendezvous

import (
	"context"
	"fmt"
	"time"
)

// How an agent rides out an etcd outage: its store re-establishes the
// session; the agent follows it, and after an outage of its own gives
// nodes whose keys vanished one lease TTL to put them back before it
// counts them lost.

// followSession logs the session's changes and wakes the protocol's loops
// (through the view) when it changes, when the grace after an outage
// ends, and when an outage has lasted JoinTimeout, so that they look
// again. It returns when ctx ends.
func (e *Elastic) followSession(ctx context.Context) {
	var wake *time.Timer
	defer func() {
		if wake != nil {
			wake.Stop()
		}
	}()
	prev, _ := e.store.Session()
	for {
		sess, changed := e.store.Session()
		if wake != nil {
			wake.Stop()
			wake = nil
		}
		switch {
		case !sess.Live:
			if prev.Live {
				e.log.Warn().Dur("lease_ttl", e.cfg.LeaseTTL).Msg("lost contact with etcd (lease keep-alives unanswered): workers keep running; re-establishing the session")
			}
			wake = time.AfterFunc(time.Until(sess.Since.Add(e.cfg.JoinTimeout)), e.agent.poke)
		case !prev.Live || sess.Since != prev.Since:
			lease := "kept"
			if sess.Renewed {
				lease = "expired: a new lease, keys put again"
			}
			e.log.Info().Str("lease", lease).Dur("outage", sess.Since.Sub(prev.Since).Round(time.Millisecond)).
				Msg("etcd session re-established: nodes whose keys vanished get one lease TTL to re-register")
			wake = time.AfterFunc(time.Until(sess.Since.Add(e.cfg.LeaseTTL)), func() {
				e.log.Info().Msg("etcd outage over: the grace to re-register ended")
				e.agent.poke()
			})
		}
		prev = sess
		e.agent.poke()
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// settling reports whether this agent is in an etcd outage of its own, or
// less than one lease TTL past it. An outage longer than the lease TTL
// makes etcd expire every agent's lease, so nodes whose keys vanished
// then are most likely putting them back, not gone.
func (e *Elastic) settling() bool {
	sess, _ := e.store.Session()
	return !sess.Live || (sess.Outages > 0 && time.Since(sess.Since) < e.cfg.LeaseTTL)
}

// missingAreLost says whether nodes whose keys vanished count as lost
// now: not while settling, and only once etcd confirms this agent's own
// lease lives. If it does not, etcd lost (or expired) every lease: that is
// an outage, and this agent re-establishes its session and settles first.
// On a healthy etcd this costs one call, so a dead node is still seen
// within its lease TTL.
func (e *Elastic) missingAreLost(ctx context.Context) bool {
	return !e.settling() && e.store.CheckSession(ctx)
}

// outageTooLong is ErrEtcdUnreachable once this agent's session has been
// down for JoinTimeout, else nil.
func (e *Elastic) outageTooLong() error {
	sess, _ := e.store.Session()
	if down := time.Since(sess.Since); !sess.Live && down >= e.cfg.JoinTimeout {
		return fmt.Errorf("%w: no answer for %s (join_timeout=%s)", ErrEtcdUnreachable, down.Round(time.Second), e.cfg.JoinTimeout)
	}
	return nil
}
