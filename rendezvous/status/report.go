package status

import (
	"time"

	"github.com/gorun/gorun/internal/goodput"
	"github.com/gorun/gorun/internal/straggler"
	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// Description is `gorun status --help`'s description: what the text
// shows (Report.WriteText) and the --json fields (Report.WriteJSON),
// which scripts may rely on: a field named here is one of Report's JSON
// fields (TestStatusJSON holds them to each other).
const Description = `Reads the job's keys on its etcd without taking part in the job (no lease, no writes).
With --watch it reads them every --interval until Ctrl-C: redrawn on a terminal, else printed
again under a time line each time the status changed.

The text fits one screen whatever the job's size: the round, its phase and why it opened, the
budgets, the master, counts of members (alive, lost), agents and waiting nodes, then the members:
a table for up to 16 members (with each node's latest step, loss and tokens/s once its agent
published them), else their hosts as SLURM hostlists (node[0001-4096]) with the lost ones named,
the waiting nodes likewise, the stragglers, and the job's first failure with the latest ones.
Lists too long for one line end in "... N more": --json has them all.

--json prints one object:
  run_id, started, incarnation, generation (SLURM_RESTART_COUNT), exists (false: no round yet)
  round, phase (joinable, running, closed), since, result, reason, master_addr, master_port
  budgets: min_nodes, max_nodes, failure_restarts, max_failure_restarts,
           change_restarts, max_change_restarts
  counts: members, workers, alive, lost, registered, waiting, others, failures,
          in_place (in-place recoveries: membership changes whose workers were kept, not restarted;
          they still count in change_restarts, the budget they use)
  members: the round's members in node-rank order (none while it is joinable):
           node_rank, first_rank (global rank of its local rank 0), id, host, addr, nproc,
           since, alive (its agent's lease lives), progress (the node's latest heartbeat figures
           as its agent published them every 2 s: rank, step, loss, tokens_per_s of its rank
           that finished the newest step; absent when it published none), snapshots (its
           PyTorch snapshots as its agent published them: ranks (rank, step, replicas: peer,
           step), recovery (the last agreement that found snapshots: round, restored, step,
           newest, redone, reason); absent when it published none)
  waiting: agents waiting for the next round: id, host, addr, nproc, since
  others:  agents with a live lease, neither members nor waiting: id, host, addr, nproc, since
  failures: every failure report, first first (the fields of the agents' reports)
  recoveries: every in-place recovery, first first: round, host (node rank 0 that recorded it),
           reason, lost (hosts), nodes, workers, at_step, steps_lost, seconds (round end to the
           first progress after it), time
  lost:    in_place_seconds, in_place_steps: the recoveries' seconds and steps_lost, summed
  stragglers: ranks whose median step compute (last 10 steps) is at least 1.5x the job's median,
           e.g. "rank 3 on node-b, 1.9x the median step compute"; the embedded trainer only
  goodput: the job's goodput as its agents published it (internal/goodput), in node-seconds
           summed over the nodes: measured (false before a step), ratio (effective over wall),
           wall_seconds = effective_seconds + lost_seconds + pending_seconds (since the last step),
           lost_by_cause (worker, node, network, straggler, restart), lost_by_phase (detection,
           rendezvous, state_transfer, first_step, redone_steps), lost (by cause, then phase),
           steps_redone, recoveries (the most any node saw), nodes (each node's own figures, host, at)`

// Report is a job's status as `gorun status` shows it, computed
// from what etcdstore.ReadStatus read; the text (WriteText) and the
// --json output (WriteJSON) are both made from it, and its JSON field
// names are the documented ones (Description).
type Report struct {
	RunID       string               `json:"run_id"`
	Started     bool                 `json:"started"`
	Incarnation int                  `json:"incarnation"`
	Generation  int                  `json:"generation"`
	Exists      bool                 `json:"exists"`
	Round       int                  `json:"round"`
	Phase       rendezvous.Phase     `json:"phase,omitempty"`
	Since       time.Time            `json:"since"`
	Result      string               `json:"result,omitempty"`
	Reason      string               `json:"reason,omitempty"`
	MasterAddr  string               `json:"master_addr,omitempty"`
	MasterPort  int                  `json:"master_port,omitempty"`
	Budgets     Budgets              `json:"budgets"`
	Counts      Counts               `json:"counts"`
	Members     []Member             `json:"members"`
	Waiting     []Node               `json:"waiting"`
	Others      []Node               `json:"others"`
	Failures    []rendezvous.Failure `json:"failures"`
	// Recoveries are the in-place recoveries: rounds that kept the
	// workers instead of restarting them, first first.
	Recoveries []rendezvous.Recovery `json:"recoveries"`
	// Lost is what the in-place recoveries cost, in all.
	Lost Lost `json:"lost"`
	// Stragglers are the ranks whose median step compute is at least
	// straggler.Factor times the job's, as the agents last published it
	// (embedded trainer only: other workers report no timing).
	Stragglers []string `json:"stragglers"`
	// Goodput is the job's goodput, from the figures its agents
	// published (package goodput).
	Goodput goodput.Job `json:"goodput"`
}

// Budgets are the job's node bounds and its two restart budgets,
// each as used and allowed.
type Budgets struct {
	MinNodes           int `json:"min_nodes"`
	MaxNodes           int `json:"max_nodes"`
	FailureRestarts    int `json:"failure_restarts"`
	MaxFailureRestarts int `json:"max_failure_restarts"`
	ChangeRestarts     int `json:"change_restarts"`
	MaxChangeRestarts  int `json:"max_change_restarts"`
}

// Counts are the sizes of the report's lists, and the workers of
// the round.
type Counts struct {
	Members    int `json:"members"`
	Workers    int `json:"workers"`
	Alive      int `json:"alive"`      // members whose agent's lease lives
	Lost       int `json:"lost"`       // members whose agent's lease is gone
	Registered int `json:"registered"` // agents with a live lease
	Waiting    int `json:"waiting"`
	Others     int `json:"others"`
	Failures   int `json:"failures"`
	InPlace    int `json:"in_place"` // in-place recoveries: not restarts
}

// Lost is what the job's in-place recoveries cost in all, as the
// agents recorded them: the time from each round's end to the first step
// after it, and the steps they threw away.
type Lost struct {
	InPlaceSeconds float64 `json:"in_place_seconds"`
	InPlaceSteps   int     `json:"in_place_steps"`
}

// Node is one agent as the report lists it.
type Node struct {
	ID    string    `json:"id"`
	Host  string    `json:"host"`
	Addr  string    `json:"addr"`
	NProc int       `json:"nproc"`
	Since time.Time `json:"since"`
}

// Member is one member of the round.
type Member struct {
	NodeRank  int `json:"node_rank"`
	FirstRank int `json:"first_rank"`
	Node
	Alive bool `json:"alive"`
	// Progress is the node's latest heartbeat figures as its agent last
	// published them (every 2 s): those of its rank that finished the
	// newest step. Nil when it published none (workers other than the
	// embedded trainer may report steps only, an older agent nothing).
	Progress *straggler.RankProgress `json:"progress,omitempty"`
	// Snapshots are the node's PyTorch snapshots as its agent last
	// published them; nil when it published none.
	Snapshots *Snapshots `json:"snapshots,omitempty"`
}

func nodeOf(m rendezvous.Member) Node {
	return Node{ID: m.ID, Host: m.Host, Addr: m.Addr, NProc: m.NProc, Since: m.Since}
}

// New computes the report of st, as read by etcdstore.ReadStatus. The members are the
// roster's when it is the current round's (running or closed), none while
// the round is joinable.
func New(st etcdstore.Status) Report {
	s := st.State
	r := Report{
		RunID: st.RunID, Started: st.Started, Incarnation: st.Incarnation, Generation: st.Generation, Exists: st.Exists,
		Round: s.Round, Phase: s.Phase, Since: s.Since, Result: s.Result, Reason: s.Reason,
		Budgets: Budgets{
			MinNodes: s.Limits.MinNodes, MaxNodes: s.Limits.MaxNodes,
			FailureRestarts: s.Failures, MaxFailureRestarts: s.Limits.MaxFailures,
			ChangeRestarts: s.Changes, MaxChangeRestarts: s.Limits.MaxChanges,
		},
		Members: []Member{}, Waiting: []Node{}, Others: []Node{}, Failures: st.Failures,
	}
	if s.Phase == rendezvous.PhaseRunning {
		r.MasterAddr, r.MasterPort = s.MasterAddr, s.MasterPort
	}
	if r.Failures == nil {
		r.Failures = []rendezvous.Failure{}
	}
	alive := make(map[string]bool, len(st.Nodes))
	for _, n := range st.Nodes {
		alive[n.ID] = true
	}
	placed := map[string]bool{}
	if st.Exists && st.Roster.Round == s.Round {
		first := 0
		for i, m := range st.Roster.Members {
			r.Members = append(r.Members, Member{NodeRank: i, FirstRank: first, Node: nodeOf(m), Alive: alive[m.ID],
				Progress: latestOf(st.Stats[m.ID]), Snapshots: ParseSnapshots(st.Stats[m.ID])})
			first += m.NProc
			placed[m.ID] = true
			if alive[m.ID] {
				r.Counts.Alive++
			}
		}
		r.Counts.Workers = first
	}
	for _, m := range st.Waiting {
		r.Waiting = append(r.Waiting, nodeOf(m))
		placed[m.ID] = true
	}
	for _, m := range st.Nodes {
		if !placed[m.ID] {
			r.Others = append(r.Others, nodeOf(m))
		}
	}
	r.Counts.Members = len(r.Members)
	r.Counts.Lost = r.Counts.Members - r.Counts.Alive
	r.Counts.Registered = len(st.Nodes)
	r.Counts.Waiting = len(r.Waiting)
	r.Counts.Others = len(r.Others)
	r.Counts.Failures = len(r.Failures)
	r.Recoveries = st.Recoveries
	if r.Recoveries == nil {
		r.Recoveries = []rendezvous.Recovery{}
	}
	r.Counts.InPlace = len(r.Recoveries)
	for _, rec := range r.Recoveries {
		r.Lost.InPlaceSeconds += rec.Seconds
		r.Lost.InPlaceSteps += rec.StepsLost
	}
	r.Stragglers = stragglersOf(st.Stats)
	r.Goodput = goodput.JobOfValues(st.Goodput)
	return r
}

// stragglersOf names the stragglers among the agents' published
// reports (see straggler.Find); a report that does not decode is left
// out.
func stragglersOf(stats map[string][]byte) []string {
	var reports []straggler.Report
	for _, v := range stats {
		if rep, err := straggler.ParseReport(v); err == nil {
			reports = append(reports, rep)
		}
	}
	names := []string{}
	for _, s := range straggler.Find(reports) {
		names = append(names, s.String())
	}
	return names
}

// latestOf is the latest figures in a node's published stats value (a
// straggler.Report), nil when it holds none or does not decode.
func latestOf(stats []byte) *straggler.RankProgress {
	rep, err := straggler.ParseReport(stats)
	if err != nil {
		return nil
	}
	if p, ok := rep.Latest(); ok {
		return &p
	}
	return nil
}
