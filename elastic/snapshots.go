package elastic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorun/gorun/internal/snapshot"
	"github.com/gorun/gorun/internal/snapshot/durable"
	"github.com/gorun/gorun/rendezvous"
)

// Snapshots is the agent's part in its workers' training-state snapshots
// (docs/snapshots-format.md): the directory they keep them in, which the
// launcher made and gave them in GORUN_SNAPSHOT_DIR, and the copies of
// each rank's snapshots that other nodes keep.
type Snapshots struct {
	Dir  string // the job's snapshot directory on this node
	Node string // this node's id, unique in the job (the rendezvous's node id)
	// Replicas is how many other nodes (the next ones in node-rank
	// order) each rank's snapshots are copied to while a round runs; 0:
	// none.
	Replicas int
	// Transfer copies snapshots between nodes; nil: this node serves and
	// fetches none (Replicas is then moot).
	Transfer Transfer
	// Durable, when not nil, is where copies of the snapshots outlive
	// every node (internal/snapshot/durable): while a round runs, this
	// node's ranks' snapshots go there; before one, node rank 0 offers
	// what is there, a source when no node holds a step every rank has.
	Durable *Durable
}

// Durable is the job's durable directory (shared storage that every node
// sees at Dir) and which snapshots are kept there: every Every-th step,
// the newest Keep complete steps.
type Durable struct {
	Dir         string
	Every, Keep int
}

// durableNode is the node id of the durable directory's offer and
// sources: no host is named so.
const durableNode = "(durable)"

// Transfer is how a node's snapshots reach other nodes' directories
// (internal/snapshot/replica over the job secret): a server that takes
// other nodes' copies into this node's directory, a fetch of one
// snapshot from another node's server, and a background push of this
// node's newest snapshots to other nodes' servers.
type Transfer interface {
	// Addr is the host:port other nodes reach this node's server at.
	Addr() string
	// Accept lets the server take copies sent for round, except of the
	// ranks in own (this node's own workers' in that round); round -1
	// takes none (between rounds, while this node agrees on a step).
	Accept(round int, own []int)
	// Fetch copies rank's snapshot of step from the server at addr into
	// dst, verifying its CRC; it gives up when ctx ends.
	Fetch(ctx context.Context, addr string, rank int, step uint64, dst *snapshot.RankSlots) error
	// Push sends, until ctx ends, each new complete snapshot of ranks
	// (in dir) to every peer, tagged with round, and calls sent for each
	// copy a peer stored. It never blocks the workers.
	Push(ctx context.Context, round int, dir string, ranks []int, peers []string, sent func(rank int, step uint64, peer string)) error
}

// SnapshotObserver is an Observer that is also told of snapshots: the
// agent calls it when its Spec.Observer implements it.
type SnapshotObserver interface {
	// SnapshotsAgreed: before round r's workers started, the agents
	// agreed that they restore rec.Step (rec.Restored), or nothing.
	SnapshotsAgreed(r rendezvous.Round, rec SnapshotRecovery)
	// SnapshotReplicated: a copy of rank's snapshot of step is now on
	// peer (its replica server's address).
	SnapshotReplicated(rank int, step uint64, peer string)
}

// The variables the agent gives a script worker about its restore
// (python/gorun reads them).
const (
	// EnvSnapshotStep is the step every rank restores, agreed by the
	// agents (decimal), or "none": restore returns None.
	EnvSnapshotStep = "GORUN_SNAPSHOT_STEP"
	// EnvSnapshotReason says, with "none", why nothing is restored; with
	// a step, that some rank's snapshot comes from the durable directory.
	EnvSnapshotReason = "GORUN_SNAPSHOT_REASON"
	// EnvSnapshotVerified is "1" when the agent verified the CRC of the
	// slot holding the agreed step: the worker need not.
	EnvSnapshotVerified = "GORUN_SNAPSHOT_VERIFIED"
)

// SnapshotRecovery is what the agents agreed before a round's workers
// started: the step they restore and how many steps that redoes.
type SnapshotRecovery struct {
	Restored bool   // the workers restore Step; else Reason says why not
	Step     uint64 // the agreed step
	// Newest is the newest step any rank had a complete snapshot of,
	// anywhere in the round (Held: there was one).
	Newest uint64
	Held   bool
	Reason string
	// Durable is the ranks that restore from the durable directory
	// rather than from a node's memory, in order.
	Durable []int
}

// Redone is the steps the restore throws away: Newest - Step (0 when
// nothing is restored).
func (s SnapshotRecovery) Redone() uint64 {
	if !s.Restored || s.Newest < s.Step {
		return 0
	}
	return s.Newest - s.Step
}

// String is the recovery's log line.
func (s SnapshotRecovery) String() string {
	if s.Restored && len(s.Durable) > 0 {
		ranks := make([]string, len(s.Durable))
		for i, r := range s.Durable {
			ranks[i] = strconv.Itoa(r)
		}
		noun := "rank"
		if len(ranks) > 1 {
			noun = "ranks"
		}
		return fmt.Sprintf("snapshots: restoring step %d, %s %s from the durable directory (newest step any rank had: %d; steps redone: %d)",
			s.Step, noun, strings.Join(ranks, ", "), s.Newest, s.Redone())
	}
	if s.Restored {
		return fmt.Sprintf("snapshots: restoring step %d (newest step any rank had: %d; steps redone: %d)", s.Step, s.Newest, s.Redone())
	}
	return "snapshots: not restoring: " + s.Reason
}

// snapRound is what the agreement before a round leaves for the round:
// the variables of its fresh workers and the peers its replicas go to.
type snapRound struct {
	env   []string
	peers []string // the replica servers of the next Replicas nodes, in node-rank order
}

// snapshotFailure is an agreement that could not be carried out on this
// node (a snapshot that could not be fetched or copied): the round fails
// as if a worker had, and the next one agrees again.
type snapshotFailure struct{ err error }

func (e *snapshotFailure) Error() string { return e.err.Error() }
func (e *snapshotFailure) Unwrap() error { return e.err }

// prepareSnapshots readies this node's snapshots for round r before its
// fresh workers start: it fences the replica server (no copy lands while
// the directory is read), scans the directory, exchanges this node's
// Offer with every node of r, agrees on the step with them
// (snapshot.Agree: every agent computes the same plan), fetches or copies
// what this node's ranks lack, and returns the variables of section 3 of
// the design for the workers. Node rank 0 also offers the durable
// directory's snapshots, if any (every node would scan it at another
// moment, and they must agree); a rank whose source is there is loaded
// from it. With no snapshots, or for workers that keep
// their state in place across rounds (Spec.InPlace: they agree among
// themselves), it does nothing. Its errors: the round ended first
// (rendezvous.ErrRoundEnded), ctx's cause, or a *snapshotFailure.
func (a *Agent) prepareSnapshots(ctx context.Context, r rendezvous.Round) (snapRound, error) {
	s := a.spec.Snapshots
	if s == nil || a.spec.InPlace {
		return snapRound{}, nil
	}
	offer := snapshot.Offer{Node: s.Node, NodeRank: r.NodeRank, FirstRank: r.FirstRank, NProc: a.spec.LocalWorkers}
	if s.Transfer != nil {
		s.Transfer.Accept(-1, nil)
		offer.Replica = s.Transfer.Addr()
	}
	held, err := snapshot.Scan(s.Dir)
	if err != nil {
		return snapRound{}, &snapshotFailure{err}
	}
	offer.Holdings = held
	mine, err := json.Marshal(a.offers(s, r, offer))
	if err != nil {
		return snapRound{}, &snapshotFailure{err}
	}
	values, err := a.rdzv.Exchange(ctx, r, mine)
	if errors.Is(err, rendezvous.ErrNoExchange) {
		// Nodes that share nothing cannot agree: restoring each rank's
		// newest would restore different steps.
		a.log.Warn().Err(err).Msg("snapshots: not restoring")
		return snapRound{env: []string{EnvSnapshotStep + "=none", EnvSnapshotReason + "=" + err.Error()}}, nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return snapRound{}, context.Cause(ctx)
		}
		if errors.Is(err, rendezvous.ErrRoundEnded) {
			return snapRound{}, err
		}
		return snapRound{}, &snapshotFailure{fmt.Errorf("snapshots: exchanging offers: %w", err)}
	}
	offers, err := decodeOffers(values)
	if err != nil {
		return snapRound{}, &snapshotFailure{err}
	}
	plan := snapshot.Agree(offers, r.WorldSize)
	rec := recoveryOf(plan, offers)
	out := snapRound{peers: ringPeers(offers, r.NodeRank, s.Replicas)}
	// A slot newer than the step restored (every slot, when none is)
	// belongs to a timeline the job abandoned: discarded, so that it is
	// neither pushed to peers nor kept as a rank's newest.
	keep := func(step uint64) bool { return plan.Restore && step <= plan.Step }
	switch {
	case plan.Restore:
		if err := a.gather(ctx, s, r, plan); err != nil {
			return snapRound{}, &snapshotFailure{err}
		}
		out.env = []string{EnvSnapshotStep + "=" + strconv.FormatUint(plan.Step, 10), EnvSnapshotVerified + "=1"}
		if len(rec.Durable) > 0 {
			out.env = append(out.env, EnvSnapshotReason+"="+strings.TrimPrefix(rec.String(), "snapshots: "))
		}
	case rec.Held:
		out.env = []string{EnvSnapshotStep + "=none", EnvSnapshotReason + "=" + plan.Reason}
	default: // nothing was ever saved (a new job): nothing to say to the script
		out.env = []string{EnvSnapshotStep + "=none"}
	}
	if n, err := snapshot.Discard(s.Dir, keep); err != nil {
		return snapRound{}, &snapshotFailure{err}
	} else if n > 0 {
		a.log.Info().Int("slots", n).Uint64("after_step", plan.Step).Bool("restore", plan.Restore).Msg("snapshots: discarded the slots of an abandoned timeline")
	}
	ev := a.log.Info()
	if rec.Held && !rec.Restored {
		ev = a.log.Warn() // there were snapshots, and none is used: the script's own checkpoint is the fallback
	}
	ev.Int("round", r.Number).Bool("restore", rec.Restored).Uint64("step", rec.Step).Uint64("newest", rec.Newest).
		Uint64("redone", rec.Redone()).Str("reason", rec.Reason).Ints("durable", rec.Durable).Msg(rec.String())
	if o, ok := a.spec.Observer.(SnapshotObserver); ok {
		o.SnapshotsAgreed(r, rec)
	}
	return out, nil
}

// offers is this node's value for round r's exchange: its own offer
// and, on node rank 0, the durable directory's (NodeRank NumNodes, after
// every node's). A durable directory that cannot be read is logged and
// offers nothing: the nodes' memory still can.
func (a *Agent) offers(s *Snapshots, r rendezvous.Round, own snapshot.Offer) []snapshot.Offer {
	out := []snapshot.Offer{own}
	if s.Durable == nil || r.NodeRank != 0 {
		return out
	}
	held, err := durable.Scan(s.Durable.Dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		a.log.Warn().Err(err).Str("dir", s.Durable.Dir).Msg("snapshots: the durable directory offers nothing")
		return out
	}
	return append(out, snapshot.Offer{Node: durableNode, NodeRank: r.NumNodes, Durable: true, Holdings: held})
}

// decodeOffers is every offer of the exchanged values (node-rank order):
// each node's own, and the durable directory's from node rank 0 alone.
func decodeOffers(values [][]byte) ([]snapshot.Offer, error) {
	var all []snapshot.Offer
	for i, v := range values {
		var list []snapshot.Offer
		if err := json.Unmarshal(v, &list); err != nil || len(list) == 0 {
			return nil, fmt.Errorf("snapshots: node rank %d's offer %q: not a JSON list of offers (%v): is every node's gorun the same version?", i, v, err)
		}
		for j, o := range list {
			if o.Durable != (j > 0) || (o.Durable && i != 0) {
				return nil, fmt.Errorf("snapshots: node rank %d's offer %d: only node rank 0 offers the durable directory, after its own", i, j)
			}
		}
		all = append(all, list...)
	}
	return all, nil
}

// recoveryOf is what plan restores, beside the newest step any offer
// held.
func recoveryOf(plan snapshot.Plan, offers []snapshot.Offer) SnapshotRecovery {
	rec := SnapshotRecovery{Restored: plan.Restore, Step: plan.Step, Reason: plan.Reason}
	for rank, src := range plan.Sources {
		if src.Durable {
			rec.Durable = append(rec.Durable, rank)
		}
	}
	slices.Sort(rec.Durable)
	for _, o := range offers {
		for _, h := range o.Holdings {
			if !rec.Held || h.Step > rec.Newest {
				rec.Newest, rec.Held = h.Step, true
			}
		}
	}
	return rec
}

// ringPeers is the replica servers of the k nodes after nodeRank in
// node-rank order, wrapping around (at most every other node), skipping
// nodes that serve none.
func ringPeers(offers []snapshot.Offer, nodeRank, k int) []string {
	byRank := slices.Clone(offers)
	slices.SortFunc(byRank, func(a, b snapshot.Offer) int { return a.NodeRank - b.NodeRank })
	var peers []string
	for i := 1; i < len(byRank) && len(peers) < k; i++ {
		if o := byRank[(nodeRank+i)%len(byRank)]; o.Replica != "" && !o.Durable {
			peers = append(peers, o.Replica)
		}
	}
	return peers
}

// gather puts the agreed step of every rank of this node into that
// rank's own slots: a snapshot of another rank held here (replicated
// state) is copied under this rank's name, one on another node is
// fetched from its replica server, one in the durable directory is
// loaded from it. One already there is left as it is.
func (a *Agent) gather(ctx context.Context, s *Snapshots, r rendezvous.Round, plan snapshot.Plan) error {
	for rank := r.FirstRank; rank < r.FirstRank+a.spec.LocalWorkers; rank++ {
		src, ok := plan.Sources[rank]
		switch {
		case !ok:
			return fmt.Errorf("snapshots: the plan has no source for rank %d", rank)
		case !src.Durable && src.Node == s.Node && src.Rank == rank:
			continue
		}
		dst, err := snapshot.OpenRank(s.Dir, rank)
		if err != nil {
			return err
		}
		if src.Durable {
			err = loadDurable(s.Durable, src)(dst)
		} else if src.Node == s.Node {
			err = copyLocal(s.Dir, src, dst)
		} else if s.Transfer == nil || src.Replica == "" {
			err = fmt.Errorf("node %s holds it and serves no copies", src.Node)
		} else {
			err = s.Transfer.Fetch(ctx, src.Replica, src.Rank, src.Step, dst)
		}
		err = errors.Join(err, dst.Close())
		if err != nil {
			return fmt.Errorf("snapshots: rank %d's snapshot of step %d (rank %d's on node %s): %w", rank, src.Step, src.Rank, src.Node, err)
		}
		a.log.Info().Int("rank", rank).Int("from_rank", src.Rank).Str("from_node", src.Node).Uint64("step", src.Step).Msg("snapshot put in place for its rank")
	}
	return nil
}

// loadDurable loads src, a snapshot in the durable directory d, into a
// rank's slots: durable.Find verifies it, durable.Load copies it.
func loadDurable(d *Durable, src snapshot.Source) func(*snapshot.RankSlots) error {
	return func(dst *snapshot.RankSlots) error {
		if d == nil {
			return errors.New("the agents agreed on the durable directory, and this node has none (--snapshot-durable)")
		}
		h, err := durable.Find(d.Dir, src.Rank, src.Step)
		if err != nil {
			return err
		}
		return durable.Load(h, dst)
	}
}

// copyLocal copies the snapshot src (of another rank, in dir) into dst;
// Write checks the payload against the header's CRC as it copies.
func copyLocal(dir string, src snapshot.Source, dst *snapshot.RankSlots) error {
	for _, p := range snapshot.Paths(dir, src.Rank) {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		defer f.Close()
		var raw [snapshot.HeaderLen]byte
		if _, err := f.ReadAt(raw[:], 0); err != nil {
			continue
		}
		h, err := snapshot.ParseHeader(raw[:])
		if err != nil || h.Step != src.Step {
			continue
		}
		return dst.Write(h, io.NewSectionReader(f, snapshot.HeaderSize, int64(h.Length)))
	}
	return fmt.Errorf("no complete slot of step %d in %s", src.Step, dir)
}

// replicate runs while round r runs: the replica server takes the copies
// of r's other ranks, this node's ranks' snapshots go to sr's peers and
// (every Durable.Every-th step) to the durable directory, until ctx ends
// (with the round); the returned func waits for the push and the copies
// to the durable directory to stop.
func (a *Agent) replicate(ctx context.Context, r rendezvous.Round, sr snapRound) func() {
	s := a.spec.Snapshots
	if s == nil || a.spec.InPlace {
		return func() {}
	}
	own := a.ranksIn(r)
	var wg sync.WaitGroup
	if s.Durable != nil {
		d := *s.Durable
		wg.Go(func() {
			if err := durable.Persist(ctx, s.Dir, own, d.Dir, d.Every, d.Keep, a.log); err != nil && ctx.Err() == nil {
				a.log.Warn().Err(err).Int("round", r.Number).Str("dir", d.Dir).Msg("snapshots: copies to the durable directory stopped for this round")
			}
		})
	}
	if s.Transfer == nil {
		return wg.Wait
	}
	s.Transfer.Accept(r.Number, own)
	if len(sr.peers) == 0 {
		return wg.Wait
	}
	sent := func(int, uint64, string) {}
	if o, ok := a.spec.Observer.(SnapshotObserver); ok {
		sent = o.SnapshotReplicated
	}
	wg.Go(func() {
		if err := s.Transfer.Push(a.log.WithContext(ctx), r.Number, s.Dir, own, sr.peers, sent); err != nil && ctx.Err() == nil {
			a.log.Warn().Err(err).Int("round", r.Number).Msg("snapshots: replication stopped; the ranks of this node restore from its memory alone")
		}
	})
	return wg.Wait
}

// snapshotOutcome is how round r comes out when its snapshots could not
// be readied (prepareSnapshots' err): the round ended elsewhere first
// (the end, once the rendezvous says it), a stop, or a failure of this
// node that ends the round as a worker's would.
func (a *Agent) snapshotOutcome(ctx context.Context, r rendezvous.Round, err error) outcome {
	if ctx.Err() != nil {
		return stopped{stoppedBy(ctx)}
	}
	if errors.Is(err, rendezvous.ErrRoundEnded) {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if end, ok := <-a.rdzv.Watch(wctx, r); ok {
			return ended{end}
		}
		return stopped{stoppedBy(ctx)}
	}
	return failed{[]rendezvous.Failure{{
		Host: a.spec.Host, NodeRank: r.NodeRank, Rank: r.FirstRank, ExitCode: 1, Time: time.Now(), Attempt: r.Number,
		Error: err.Error(),
	}}}
}

// persistLast copies the snapshots of this node's ranks in round r, the
// last it ran, to the durable directory, whatever their step
// (durable.PersistLast), when the job has one: for a job that ends here
// without succeeding (a stop signal: scancel, the time limit, a
// preemption; a requeue; a failure), so that running it again restores the
// newest step every rank saved, not the last --snapshot-durable-every one.
// The workers are gone by then, so their slots hold still. A second stop
// signal cuts it short; what it could not copy is logged and said on the
// report, and never changes how the agent ends.
func (a *Agent) persistLast(r rendezvous.Round) {
	s := a.spec.Snapshots
	if s == nil || s.Durable == nil || a.spec.InPlace {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-a.kill:
			cancel()
		case <-ctx.Done():
		}
	}()
	own := a.ranksIn(r)
	start := time.Now()
	kept, err := durable.PersistLast(ctx, s.Dir, own, s.Durable.Dir, s.Durable.Keep, a.log)
	if err != nil {
		a.log.Warn().Err(err).Str("dir", s.Durable.Dir).Msg("snapshots: the last copies to the durable directory are not all there")
		fmt.Fprintf(a.spec.Report, "gorun: snapshots: not every last snapshot reached %s: %v\n", s.Durable.Dir, err)
	}
	if len(kept) == 0 {
		return
	}
	var steps []string
	for _, h := range kept {
		steps = append(steps, fmt.Sprintf("rank %d step %d", h.Rank, h.Step))
	}
	a.log.Info().Str("dir", s.Durable.Dir).Dur("took", time.Since(start)).Strs("snapshots", steps).
		Msg("snapshots: this node's last snapshots are in the durable directory")
	fmt.Fprintf(a.spec.Report, "gorun: snapshots: this node's newest is step %d, in %s: run the job again to go on from the newest step every rank has there\n",
		kept[0].Step, s.Durable.Dir)
}

// ranksIn is the global ranks of this node's workers in round r.
func (a *Agent) ranksIn(r rendezvous.Round) []int {
	own := make([]int, a.spec.LocalWorkers)
	for i := range own {
		own[i] = r.FirstRank + i
	}
	return own
}
