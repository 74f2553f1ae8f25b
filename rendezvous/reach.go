package rendezvous

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/reach"
)

// A network fault that costs no lease (packets dropped one way, a link
// between two nodes cut while both still reach etcd) leaves every member
// in the job and their workers blocked on each other. It is seen by the
// workers: a peer rank they hear nothing from (heartbeat.SilentAfter). The
// agent then probes that rank's node (package reach: a connection both
// ways to its agent); a node it cannot reach it reports under the round
// (Unreachable). The aggregator leaves out of the next round the fewest
// nodes that end every reported pair (LeaveOut): the round opens without
// them as for a lost node, and the others re-form in place. A node left
// out stays in the job: it joins a round again once it reaches every
// member, a few probes in a row (rejoinable).

// Reachability probes: how long one may take before a node is reported
// unreachable (a lost SYN is retried by the kernel after a second, so a
// lossy link fails it); how long one of the probes of a node left out
// may take, how many in a row must pass before it joins again, and how
// far apart (a node that answers does so in milliseconds: a short bound
// sees a heal sooner).
const (
	ProbeTimeout       = time.Second
	rejoinProbeTimeout = 500 * time.Millisecond
	reachPasses        = 3
	reachEvery         = 100 * time.Millisecond
)

// reachState is what this agent knows of reachability: whom it reported
// unreachable in which round, and, while it is left out, its probes.
type reachState struct {
	mu       sync.Mutex
	reported map[int][]string // round -> members this node reported unreachable
	leftOut  bool             // this node was left out and has not joined since
	passes   int              // probes of every member in a row that passed
	lastErr  error            // the last probe that failed, while left out
}

// Unreachable checks, when a worker of this node heard nothing from peer
// rank `rank` of round r, whether that rank's node can be reached: a
// probe of its agent (ProbeTimeout). When it cannot, it reports the node
// under the round, with every other this node cannot reach: the
// aggregator then leaves one side out of the next round. A rank of this
// node, a node that answers no probes, or a round that is over already
// is no report. It fails when the store does, or ctx ends.
func (e *Elastic) Unreachable(ctx context.Context, r Round, rank int) error {
	roster, err := e.readRoster(ctx)
	if err != nil || roster.Round != r.Number {
		return err
	}
	m, ok := holderOf(roster.Members, rank)
	if !ok || m.ID == e.cfg.Self.ID || m.Reach == 0 {
		return nil
	}
	if !e.reach.mark(r.Number, m.ID) {
		return nil // reported already
	}
	perr := reach.Probe(ctx, m.Addr, m.Reach, ProbeTimeout)
	if perr == nil {
		e.reach.unmark(r.Number, m.ID)
		e.log.Info().Int("rank", rank).Str("node", m.Host).Msg("a worker heard nothing from a peer, but its node answers: not a network fault")
		return nil
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if agentGone(perr) {
		return e.fence(ctx, m, perr)
	}
	ids := e.reach.reportedIn(r.Number)
	e.log.Warn().Int("rank", rank).Str("node", m.Host).AnErr("probe", perr).Msg("cannot reach a peer's node (it died, or a network fault): reporting it")
	if err := e.put(ctx, unreachKey(r.Number, e.cfg.Self.ID), ids, true); err != nil {
		return err
	}
	if snap, _ := e.agent.read(); snap.leader == m.ID {
		// The node gone is the aggregator, which would act on the report:
		// its leader key would outlive it by its lease TTL. Deleting it
		// makes the candidates claim it at once. Should that node live
		// after all (a network fault), it leads no longer and its
		// transitions, compare-and-swaps on the state, cannot clash.
		e.log.Info().Str("node", m.Host).Msg("the node gone held the aggregator's key: releasing it for a new aggregator")
		return e.store.Delete(ctx, KeyLeader)
	}
	return nil
}

// agentGone says whether a probe's error shows the prober's peer agent
// gone with its kernel up: the connection was refused (nothing listens on
// its probe port) or reset (the listener closed with the probe still in
// its backlog, as the agent died). A live agent reads the probe and
// answers it; a node cut off or powered off answers nothing, which is
// only a suspicion (a timeout), not this.
func agentGone(perr error) bool {
	return errors.Is(perr, syscall.ECONNREFUSED) || errors.Is(perr, syscall.ECONNRESET)
}

// fence removes the registration of member m, whose agent refused a
// probe (agentGone): its kernel answers and nothing listens on the
// agent's probe port, so the agent is gone (it died with its kernel up:
// kill -9, a crash). That is a death seen, not a suspicion to weigh against other
// reports (LeaveOut would weigh a survivor that reports two dead peers
// against them, and leave it out): the aggregator opens the next round
// without m at once, as its lease's expiry would. Should m be alive after
// all, it registers again and joins as a new node (Next). When m held the
// aggregator's key, that goes too, so that a new aggregator acts now.
func (e *Elastic) fence(ctx context.Context, m Member, perr error) error {
	e.log.Warn().Str("node", m.Host).AnErr("probe", perr).Msg("a peer's agent is gone (its probe port refused): removing its registration")
	if err := e.store.Delete(ctx, nodeKey(m.ID)); err != nil {
		return err
	}
	if snap, _ := e.agent.read(); snap.leader == m.ID {
		return e.store.Delete(ctx, KeyLeader)
	}
	return nil
}

// mark records id as reported in round; false when it was already.
func (s *reachState) mark(round int, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reported == nil {
		s.reported = map[int][]string{}
	}
	if slices.Contains(s.reported[round], id) {
		return false
	}
	for r := range s.reported {
		if r < round {
			delete(s.reported, r)
		}
	}
	s.reported[round] = append(s.reported[round], id)
	return true
}

func (s *reachState) unmark(round int, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reported[round] = slices.DeleteFunc(s.reported[round], func(x string) bool { return x == id })
}

func (s *reachState) reportedIn(round int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reported[round])
}

// readRoster reads the roster of the last round that froze.
func (e *Elastic) readRoster(ctx context.Context) (Roster, error) {
	kvs, _, err := e.store.List(ctx, KeyRoster, 1)
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

// rejoinable says whether this node, left out of the job for being
// unreachable, may join a round again: every member of the last round
// answered its probes reachPasses times in a row (Next probes again
// reachEvery later while it says no). A node that was never left out
// always may.
func (e *Elastic) rejoinable(ctx context.Context) bool {
	s := &e.reach
	s.mu.Lock()
	left := s.leftOut
	s.mu.Unlock()
	if !left {
		return true
	}
	err := e.reachMembers(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.lastErr == nil || s.passes > 0 {
			e.log.Info().Err(err).Msg("left out of the job: waiting until this node reaches every member")
		}
		s.passes, s.lastErr = 0, err
		return false
	}
	if s.passes++; s.passes < reachPasses {
		return false
	}
	e.log.Info().Msg("this node reaches every member again: rejoining the job")
	s.leftOut, s.passes, s.lastErr = false, 0, nil
	return true
}

// setLeftOut records that this node was left out of the job (st names it).
func (e *Elastic) setLeftOut(st State) {
	if !slices.Contains(st.LeftOut, e.cfg.Self.ID) {
		return
	}
	s := &e.reach
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.leftOut {
		e.log.Warn().Int("round", st.Round).Str("reason", st.Reason).Msg("this node was left out of the job's next round")
	}
	s.leftOut = true
}

// leftOutError is why a node left out did not get back in, nil when it
// was not left out.
func (e *Elastic) leftOutError() error {
	s := &e.reach
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.leftOut {
		return nil
	}
	return cmp.Or(s.lastErr, errors.New("its probes of the members never passed"))
}

// reachMembers probes every member of the last round that froze but this
// node, at once, and returns what failed.
func (e *Elastic) reachMembers(ctx context.Context) error {
	roster, err := e.readRoster(ctx)
	if err != nil {
		return err
	}
	errs := make([]error, len(roster.Members))
	var wg sync.WaitGroup
	for i, m := range roster.Members {
		if m.ID == e.cfg.Self.ID || m.Reach == 0 {
			continue
		}
		wg.Go(func() {
			if err := reach.Probe(ctx, m.Addr, m.Reach, rejoinProbeTimeout); err != nil {
				errs[i] = fmt.Errorf("node %s: %w", m.Host, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
