package rendezvous

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"
)

// Phase is where a round is in its life: joinable -> running, and a job
// ends closed.
type Phase string

// The phases of a round.
const (
	PhaseJoinable Phase = "joinable" // nodes join by writing their join key
	PhaseRunning  Phase = "running"  // members, node ranks and the master fixed; workers run
	PhaseClosed   Phase = "closed"   // the job is over: Result says how
)

// Member is one node as it takes part in a round.
type Member struct {
	ID        string    `json:"id"`             // unique per agent process
	Host      string    `json:"host"`           // name shown to people
	Addr      string    `json:"addr"`           // address workers reach this node at
	Preferred int       `json:"preferred_rank"` // SLURM_NODEID or --node-rank; -1: join order
	NProc     int       `json:"nproc"`          // workers on this node
	Order     int64     `json:"order"`          // join order: the etcd revision of its join key
	Since     time.Time `json:"since"`          // when its agent joined the job
	// Port is the MASTER_PORT this node offers, free on Addr when it
	// joined a round, should it be node rank 0 of that round.
	Port int `json:"port,omitempty"`
	// Reach is the port on Addr where this node's agent answers
	// reachability probes (package reach); 0: it answers none, and it is
	// never left out for being unreachable.
	Reach int `json:"reach,omitempty"`
}

// Limits are the job's bounds, the same on every node.
type Limits struct {
	MinNodes, MaxNodes int
	MaxFailures        int // restarts after worker failures (--max-restarts)
	MaxChanges         int // restarts after membership changes (rdzv-conf max_membership_changes)
	// StartNodes, when above MinNodes, is how many nodes the job's first
	// round (round 0) waits for: a SLURM step without --nnodes starts on
	// all of its nodes, then goes on with as few as MinNodes after losing
	// some. 0: MinNodes.
	StartNodes int
}

// Needed is how many nodes round needs to form: StartNodes for the
// first round when set, else MinNodes.
func (l Limits) Needed(round int) int {
	if round == 0 {
		return max(l.MinNodes, l.StartNodes)
	}
	return l.MinNodes
}

// Results of a closed job.
const (
	ResultSucceeded = "succeeded"
	ResultFailed    = "failed"
)

// State is the one state key of a job, which every agent watches. It
// changes only by compare-and-swap on its revision, so every transition is
// taken by exactly one node. It stays small at any scale: the members of
// a round are in the job's Roster, and each node's place in it in a
// placement bucket, so that a change costs etcd one small event per agent.
type State struct {
	Round      int       `json:"round"`
	Phase      Phase     `json:"phase"`
	Nodes      int       `json:"nodes,omitempty"`      // running: members of the round
	WorldSize  int       `json:"world_size,omitempty"` // running: workers of the round
	MasterAddr string    `json:"master_addr,omitempty"`
	MasterPort int       `json:"master_port,omitempty"`
	Reason     string    `json:"reason,omitempty"` // why this round opened, or why the job closed
	Failures   int       `json:"failures"`         // restarts used after worker failures
	Changes    int       `json:"changes"`          // restarts used after membership changes
	Result     string    `json:"result,omitempty"` // closed: succeeded or failed
	Since      time.Time `json:"since"`            // when the phase began
	Limits     Limits    `json:"limits"`           // the job's bounds, as the node that opened it saw them
	// Cause says why this round opened, so that a restart charged to a
	// worker failure can be charged to a node loss instead once a lost
	// node of the round before (the Roster still holds it) is seen gone.
	Cause Cause `json:"cause"`
	// Lost are the hosts whose loss opened this round, when that is its
	// cause.
	Lost []string `json:"lost,omitempty"`
	// InPlace, in a round opened for a worker failure (CauseFailure),
	// says that the failed worker's agent restarts it alone: every other
	// worker goes on into this round in place, as after a membership
	// change (Elastic.FailedInPlace).
	InPlace bool `json:"in_place,omitempty"`
	// Grow says this round opened only for nodes waiting to join: the
	// members of the round before lost nobody, so their workers' world is
	// intact and they go into this round at a step boundary.
	Grow bool `json:"grow,omitempty"`
	// LeftOut are the nodes (ids) this round opened without: alive, but
	// another member of the round before could not reach them (a network
	// fault no lease shows, such as packets dropped one way). Each joins
	// a round again once it reaches every member (Elastic.Next).
	LeftOut []string `json:"left_out,omitempty"`
	// Judge, in a running round whose every member stalled with no
	// culprit of its own, is the member that names the culprit: the
	// first to report its stall.
	Judge string `json:"judge,omitempty"`
}

// Roster is the members of the last round that froze, in node-rank order:
// written once per round by the node that froze it, read by the
// aggregator and by `gorun status`, never watched by the agents.
type Roster struct {
	Round   int      `json:"round"`
	Members []Member `json:"members"`
}

// Placement is one node's place in a running round. Member is false for a
// node that joined but did not fit (the round took MaxNodes).
type Placement struct {
	Round     int  `json:"-"`
	Member    bool `json:"member,omitempty"`
	NodeRank  int  `json:"node_rank"`
	FirstRank int  `json:"first_rank"` // global rank of the node's local rank 0
}

// PlaceBuckets is how many keys hold the placements of a round: a node
// follows only its own bucket, so a round costs it one event, and the
// placements are written with the round's state in one transaction.
const PlaceBuckets = 64

// Bucket is the placements of one round for the nodes whose ids hash to
// one bucket (see BucketOf).
type Bucket struct {
	Round  int                  `json:"round"`
	Places map[string]Placement `json:"places"`
}

// BucketOf is the bucket of node id's placements.
func BucketOf(id string) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % PlaceBuckets)
}

// Cause is why a new round opens.
type Cause int

// The causes of a new round; each has its own budget.
const (
	CauseFailure    Cause = iota // a worker failed
	CauseMembership              // a node left or a node is waiting to join
)

// Initial is a job's first state: round 0, joinable.
func Initial(lim Limits, now time.Time) State {
	return State{Phase: PhaseJoinable, Since: now, Limits: lim}
}

// rankOrder orders members for node ranks: preferred ranks first, in that
// order, then the others in join order.
func rankOrder(a, b Member) int {
	ap, bp := a.Preferred < 0, b.Preferred < 0
	if ap != bp {
		if ap {
			return 1
		}
		return -1
	}
	return cmp.Or(cmp.Compare(a.Preferred, b.Preferred), cmp.Compare(a.Order, b.Order), cmp.Compare(a.ID, b.ID))
}

// Freeze fixes the round's members and starts it: ranks 0..n-1 follow
// preferred ranks, then join order, so a node keeps its place across
// rounds, and node rank 0's offered port is the master's. It returns the
// running state and its roster, and fails unless s is joinable and joined
// holds between MinNodes and MaxNodes.
func (s State) Freeze(joined []Member, lim Limits, now time.Time) (State, Roster, error) {
	if s.Phase != PhaseJoinable {
		return s, Roster{}, fmt.Errorf("rendezvous: freeze round %d in phase %s", s.Round, s.Phase)
	}
	if len(joined) < lim.MinNodes || len(joined) > lim.MaxNodes {
		return s, Roster{}, fmt.Errorf("rendezvous: freeze round %d with %d nodes, outside %d..%d", s.Round, len(joined), lim.MinNodes, lim.MaxNodes)
	}
	members := slices.Clone(joined)
	slices.SortFunc(members, rankOrder)
	s.Phase, s.Since, s.Nodes, s.WorldSize = PhaseRunning, now, len(members), 0
	s.MasterAddr, s.MasterPort = members[0].Addr, members[0].Port
	for _, m := range members {
		s.WorldSize += m.NProc
	}
	return s, Roster{Round: s.Round, Members: members}, nil
}

// Buckets are the places of the roster's members, and of joined nodes
// that did not fit, by bucket: every one of the PlaceBuckets buckets, so
// that every node learns whether the round took it. A node whose join key
// landed after the round froze (the aggregator did not see it) finds its
// bucket at the round without it and waits for the next round, as a node
// that did not fit does; had its bucket not been written, it would wait
// for a placement that never comes, its workers idle, unseen.
func (r Roster) Buckets(joined []Member) map[int]Bucket {
	out := make(map[int]Bucket, PlaceBuckets)
	for b := range PlaceBuckets {
		out[b] = Bucket{Round: r.Round, Places: map[string]Placement{}}
	}
	set := func(id string, p Placement) { out[BucketOf(id)].Places[id] = p }
	for _, m := range joined {
		set(m.ID, Placement{Round: r.Round, NodeRank: -1, FirstRank: -1})
	}
	first := 0
	for i, m := range r.Members {
		set(m.ID, Placement{Round: r.Round, Member: true, NodeRank: i, FirstRank: first})
		first += m.NProc
	}
	return out
}

// Next opens the next round for cause, or closes the job as failed when
// that cause's budget is spent. A closed job stays closed.
func (s State) Next(cause Cause, reason string, lim Limits, now time.Time) State {
	if s.Phase == PhaseClosed {
		return s
	}
	switch cause {
	case CauseFailure:
		if s.Failures >= lim.MaxFailures {
			return s.Close(ResultFailed, fmt.Sprintf("%s; restart budget spent (%d of --max-restarts=%d used)", reason, s.Failures, lim.MaxFailures), now)
		}
		s.Failures++
	case CauseMembership:
		if s.Changes >= lim.MaxChanges {
			return s.Close(ResultFailed, fmt.Sprintf("%s; membership-change budget spent (%d of max_membership_changes=%d used)", reason, s.Changes, lim.MaxChanges), now)
		}
		s.Changes++
	}
	return State{
		Round: s.Round + 1, Phase: PhaseJoinable, Reason: reason,
		Failures: s.Failures, Changes: s.Changes, Since: now, Limits: s.Limits,
		Cause: cause,
	}
}

// Reattribute charges a restart opened for a worker failure to a node loss
// instead when a member of the round before (previous, its roster) has no
// live session: a node that dies shows up first as failures of its peers'
// workers (their connections to it break), and only a lease TTL later as
// a lost node. It returns the lost nodes; s is unchanged when there are
// none.
func (s State) Reattribute(previous Roster, alive map[string]bool) (State, []Member) {
	if s.Phase != PhaseJoinable || s.Cause != CauseFailure || previous.Round != s.Round-1 {
		return s, nil
	}
	var lost []Member
	var hosts []string
	for _, m := range previous.Members {
		if !alive[m.ID] {
			lost = append(lost, m)
			hosts = append(hosts, m.Host)
		}
	}
	if len(lost) == 0 {
		return s, nil
	}
	s.Failures = max(0, s.Failures-1)
	s.Changes++
	s.Cause = CauseMembership
	s.Lost = hosts
	s.Reason = fmt.Sprintf("node %s left (its lease expired); its peers' workers failed first", strings.Join(hosts, ", "))
	return s, lost
}

// Close ends the job with result.
func (s State) Close(result, reason string, now time.Time) State {
	s.Phase, s.Result, s.Reason, s.Since = PhaseClosed, result, reason, now
	return s
}

// RoundFor is the round as the node placed at p sees it; ok is false
// when p is not a member of s's round or the round is not running.
func (s State) RoundFor(p Placement) (Round, bool) {
	if s.Phase != PhaseRunning || p.Round != s.Round || !p.Member {
		return Round{}, false
	}
	return Round{Number: s.Round, NodeRank: p.NodeRank, NumNodes: s.Nodes, FirstRank: p.FirstRank,
		WorldSize: s.WorldSize, MasterAddr: s.MasterAddr, MasterPort: s.MasterPort}, true
}

// ShouldFreeze says whether a joinable round with these joined nodes
// freezes now: at MaxNodes; or, with at least lim.Needed nodes, once the last
// call passed, or — after the first round, when the job's nodes are known
// — once every live node has joined.
func ShouldFreeze(s State, joined, alive int, lim Limits, lastCallPassed bool) bool {
	switch {
	case s.Phase != PhaseJoinable || joined < lim.Needed(s.Round):
		return false
	case joined >= lim.MaxNodes || lastCallPassed:
		return true
	}
	return s.Round > 0 && joined >= alive
}
