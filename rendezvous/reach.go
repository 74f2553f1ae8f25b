package rendezvous

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gorun/gorun/rendezvous/liveness"
)

// A network fault that costs no lease (packets dropped one way, a link
// between two nodes cut while both still reach etcd) leaves every member
// in the job and their workers blocked on each other. It is seen by the
// workers: a peer rank they hear nothing from (heartbeat.SilentAfter). The
// agent then probes that rank's node (package liveness, over package
// reach: a connection both ways to its agent); a node it cannot reach it
// reports under the round (Unreachable). The aggregator leaves out of the
// next round the fewest nodes that end every reported pair (LeaveOut): the
// round opens without them as for a lost node, and the others re-form in
// place. A node left out stays in the job: it joins a round again once it
// reaches every member, a few probes in a row (liveness.Gate).

// Unreachable checks, when a worker of this node heard nothing from peer
// rank `rank` of round r, whether that rank's node can be reached: its
// prober (package liveness) probes the node's agent and reports it under
// the round, with every other this node cannot reach, or fences it when
// its agent is gone (see fencer). The aggregator then leaves one side out
// of the next round. A rank of this node, a node that answers no probes,
// or a round that is over already is no report. It fails when the store
// does, or ctx ends.
func (e *Elastic) Unreachable(ctx context.Context, r Round, rank int) error {
	roster, err := readRoster(ctx, e.store)
	if err != nil || roster.Round != r.Number {
		return err
	}
	m, ok := holderOf(roster.Members, rank)
	if !ok || m.ID == e.cfg.Self.ID || m.Reach == 0 {
		return nil
	}
	return e.prober.Check(ctx, r.Number, rank, peerOf(m))
}

// peerOf is member m as liveness probes it.
func peerOf(m Member) liveness.Peer {
	return liveness.Peer{ID: m.ID, Host: m.Host, Addr: m.Addr, Reach: m.Reach}
}

// peers lists the members of the last round that froze but self, for the
// rejoin gate (liveness.Gate) to probe.
func peers(store Store, self string) func(ctx context.Context) ([]liveness.Peer, error) {
	return func(ctx context.Context) ([]liveness.Peer, error) {
		roster, err := readRoster(ctx, store)
		if err != nil {
			return nil, err
		}
		var out []liveness.Peer
		for _, m := range roster.Members {
			if m.ID != self {
				out = append(out, peerOf(m))
			}
		}
		return out, nil
	}
}

// fencer is the round protocol's side of liveness (liveness.Protocol): it
// writes what this node's prober decided.
type fencer struct{ e *Elastic }

// Report puts this node's unreachable peers of round under the round, for
// the aggregator (leaveOutUnreachable). When the peer just found held the
// aggregator's key, that goes too: the aggregator, which would act on the
// report, is gone, and its key would outlive it by its lease TTL.
// Deleting it makes the candidates claim it at once. Should that node
// live after all (a network fault), it leads no longer and its
// transitions, compare-and-swaps on the state, cannot clash.
func (f fencer) Report(ctx context.Context, round int, ids []string, peer liveness.Peer) error {
	e := f.e
	if err := e.put(ctx, unreachKey(round, e.cfg.Self.ID), ids, true); err != nil {
		return err
	}
	if snap, _ := e.agent.read(); snap.leader == peer.ID {
		e.log.Info().Str("node", peer.Host).Msg("the node gone held the aggregator's key: releasing it for a new aggregator")
		return e.store.Delete(ctx, KeyLeader)
	}
	return nil
}

// Fence removes the registration of peer, whose agent refused a probe
// (liveness.AgentGone): its kernel answers and nothing listens on the
// agent's probe port, so the agent is gone (it died with its kernel up:
// kill -9, a crash). That is a death seen, not a suspicion to weigh
// against other reports (LeaveOut would weigh a survivor that reports two
// dead peers against them, and leave it out): the aggregator opens the
// next round without the peer at once, as its lease's expiry would.
// Should it be alive after all, it registers again and joins as a new
// node (Next). When it held the aggregator's key, that goes too, so that
// a new aggregator acts now.
func (f fencer) Fence(ctx context.Context, peer liveness.Peer) error {
	e := f.e
	if err := e.store.Delete(ctx, nodeKey(peer.ID)); err != nil {
		return err
	}
	if snap, _ := e.agent.read(); snap.leader == peer.ID {
		return e.store.Delete(ctx, KeyLeader)
	}
	return nil
}

// readRoster reads the roster of the last round that froze.
func readRoster(ctx context.Context, store Store) (Roster, error) {
	kvs, _, err := store.List(ctx, KeyRoster, 1)
	if err != nil || len(kvs) == 0 {
		return Roster{Round: -1}, err
	}
	return DecodeRoster(kvs[0].Value)
}

// holderOf is the member that holds global rank among members (in node
// rank order).
func holderOf(members []Member, rank int) (Member, bool) {
	first := 0
	for _, m := range members {
		if rank >= first && rank < first+m.NProc {
			return m, true
		}
		first += m.NProc
	}
	return Member{}, false
}

// LeaveOut is the members (ids, in node-rank order) to leave out of the
// next round so that no two members left in reported each other
// unreachable: reports maps a member to those it cannot reach. It takes
// the fewest it can find greedily: first the node in the most reported
// pairs, then the one reported by more nodes (a node that drops packets
// is reported by all its peers; the one that reports is the healthy
// side), then the highest node rank (node rank 0 hosts the master).
// Reports by or of nodes that are not members are ignored.
func LeaveOut(members []Member, reports map[string][]string) []string {
	rank := make(map[string]int, len(members))
	for i, m := range members {
		rank[m.ID] = i
	}
	pairs := map[[2]int]bool{}
	reportedBy := map[int]map[int]bool{}
	for from, ids := range reports {
		a, ok := rank[from]
		if !ok {
			continue
		}
		for _, id := range ids {
			b, ok := rank[id]
			if !ok || a == b {
				continue
			}
			pairs[[2]int{min(a, b), max(a, b)}] = true
			if reportedBy[b] == nil {
				reportedBy[b] = map[int]bool{}
			}
			reportedBy[b][a] = true
		}
	}
	var out []int
	for len(pairs) > 0 {
		in := map[int]int{}
		for p := range pairs {
			in[p[0]]++
			in[p[1]]++
		}
		best := -1
		for n := range in {
			if best < 0 || cmp.Or(cmp.Compare(in[n], in[best]), cmp.Compare(len(reportedBy[n]), len(reportedBy[best])), cmp.Compare(n, best)) > 0 {
				best = n
			}
		}
		out = append(out, best)
		for p := range pairs {
			if p[0] == best || p[1] == best {
				delete(pairs, p)
			}
		}
	}
	slices.Sort(out)
	ids := make([]string, len(out))
	for i, n := range out {
		ids[i] = members[n].ID
	}
	return ids
}

// leaveOutUnreachable opens the next round without the members that
// others reported unreachable (LeaveOut), unless fewer than MinNodes
// would be left: then the workers' own timeouts and the in-place re-form
// of the same members (Reform) are all there is. It reports whether it
// opened one.
func (a *aggregator) leaveOutUnreachable(ctx context.Context, snap snapshot) (bool, error) {
	e, st := a.e, snap.state
	if len(snap.unreach) == 0 {
		return false, nil
	}
	out := LeaveOut(snap.roster.Members, snap.unreach)
	if len(out) == 0 {
		return false, nil
	}
	if left := len(snap.roster.Members) - len(out); left < e.cfg.Limits.MinNodes {
		if a.cannotLeaveOut != st.Round {
			a.cannotLeaveOut = st.Round
			e.log.Warn().Strs("unreachable", out).Int("min_nodes", e.cfg.Limits.MinNodes).
				Msg("members cannot reach each other, but leaving one side out would leave fewer than the minimum of nodes: the workers' timeouts decide")
		}
		return false, nil
	}
	byID := make(map[string]Member, len(snap.roster.Members))
	for _, m := range snap.roster.Members {
		byID[m.ID] = m
	}
	var hosts, why []string
	var lost []Member
	for _, id := range out {
		m := byID[id]
		hosts, lost = append(hosts, m.Host), append(lost, m)
		var by []string
		for from, ids := range snap.unreach {
			if slices.Contains(ids, id) {
				by = append(by, byID[from].Host)
			} else if from == id {
				for _, x := range ids {
					by = append(by, byID[x].Host)
				}
			}
		}
		slices.Sort(by)
		why = append(why, fmt.Sprintf("%s (%s could not reach it)", m.Host, strings.Join(slices.Compact(by), ", ")))
	}
	reason := fmt.Sprintf("node %s left out: its agent did not answer a member's probe (the node died, or a network fault cut it off one way or both); it rejoins once it reaches every member", strings.Join(why, ", "))
	if err := e.recordLeftOut(ctx, st.Round, snap.roster.Members, lost, reason); err != nil {
		return true, err
	}
	next := st.Next(CauseMembership, reason, e.cfg.Limits, time.Now())
	if next.Phase == PhaseJoinable {
		next.Lost, next.LeftOut = hosts, out
	}
	return true, e.cas(ctx, snap.stateRev, st, next)
}

// recordLeftOut writes a failure report for each node left out of the
// round after round, as recordLost does for a lost node.
func (e *Elastic) recordLeftOut(ctx context.Context, round int, members, out []Member, reason string) error {
	for _, m := range out {
		f := Failure{Host: m.Host, NodeRank: -1, Rank: -1, Signal: "left out", Time: time.Now(), Attempt: round,
			Ranks: ranksOf(members, m.ID), Error: reason}
		if err := e.put(ctx, nodeFailureKey(round, m.ID), f, false); err != nil {
			return err
		}
	}
	return nil
}
