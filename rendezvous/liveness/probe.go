package liveness

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/internal/reach"
)

// Probes: how long one may take before a peer is reported unreachable (a
// lost SYN is retried by the kernel after a second, so a lossy link fails
// it); how long one of the probes of a node left out may take, how many
// in a row must pass before it joins again, and how far apart (a node
// that answers does so in milliseconds: a short bound sees a heal
// sooner).
const (
	ProbeTimeout       = time.Second
	rejoinProbeTimeout = 500 * time.Millisecond
	rejoinPasses       = 3
	RejoinEvery        = 100 * time.Millisecond
)

// Peer is another member's node as liveness probes it.
type Peer struct {
	ID    string // its node id
	Host  string // its host name, for logs
	Addr  string // the address its agent's probe port listens on
	Reach int    // its agent's probe port; 0: it answers no probes
}

// Protocol is what liveness tells the round protocol, which writes it.
type Protocol interface {
	// Report records, under round, that this node cannot reach the peers
	// ids (every one it reported in round; peer the one just found).
	Report(ctx context.Context, round int, ids []string, peer Peer) error
	// Fence removes the registration of peer, whose agent is gone, so the
	// job goes on without it at once.
	Fence(ctx context.Context, peer Peer) error
}

// Prober checks the peers this node's workers stopped hearing from, and
// remembers whom it reported in which round.
type Prober struct {
	proto Protocol
	log   zerolog.Logger

	mu       sync.Mutex
	reported map[int][]string // round -> peers this node reported unreachable
}

// NewProber returns a Prober that reports through proto and logs to log.
func NewProber(proto Protocol, log zerolog.Logger) *Prober {
	return &Prober{proto: proto, log: log, reported: map[int][]string{}}
}

// Check probes peer, the node of rank, whose silence a worker of this
// node saw in round, once per round: an answer is no fault; a refused
// probe (AgentGone) fences it; no answer reports it with every other peer
// this node cannot reach in round. It fails when the protocol does, or
// with ctx's cause when ctx ends.
func (p *Prober) Check(ctx context.Context, round, rank int, peer Peer) error {
	if !p.mark(round, peer.ID) {
		return nil // reported already
	}
	perr := reach.Probe(ctx, peer.Addr, peer.Reach, ProbeTimeout)
	if perr == nil {
		p.unmark(round, peer.ID)
		p.log.Info().Int("rank", rank).Str("node", peer.Host).Msg("a worker heard nothing from a peer, but its node answers: not a network fault")
		return nil
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if AgentGone(perr) {
		p.log.Warn().Str("node", peer.Host).AnErr("probe", perr).Msg("a peer's agent is gone (its probe port refused): removing its registration")
		return p.proto.Fence(ctx, peer)
	}
	p.log.Warn().Int("rank", rank).Str("node", peer.Host).AnErr("probe", perr).Msg("cannot reach a peer's node (it died, or a network fault): reporting it")
	return p.proto.Report(ctx, round, p.reportedIn(round), peer)
}

// AgentGone says whether a probe's error shows the prober's peer agent
// gone with its kernel up: the connection was refused (nothing listens on
// its probe port) or reset (the listener closed with the probe still in
// its backlog, as the agent died). A live agent reads the probe and
// answers it; a node cut off or powered off answers nothing, which is
// only a suspicion (a timeout), not this. That is a death seen, not a
// suspicion to weigh against other reports, so it fences.
func AgentGone(perr error) bool {
	return errors.Is(perr, syscall.ECONNREFUSED) || errors.Is(perr, syscall.ECONNRESET)
}

// mark records id as reported in round; false when it was already.
func (p *Prober) mark(round int, id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if slices.Contains(p.reported[round], id) {
		return false
	}
	for r := range p.reported {
		if r < round {
			delete(p.reported, r)
		}
	}
	p.reported[round] = append(p.reported[round], id)
	return true
}

func (p *Prober) unmark(round int, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reported[round] = slices.DeleteFunc(p.reported[round], func(x string) bool { return x == id })
}

func (p *Prober) reportedIn(round int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.reported[round])
}

// probeAll probes every peer at once (rejoinProbeTimeout each) and
// returns what failed; a peer that answers no probes is skipped.
func probeAll(ctx context.Context, peers []Peer) error {
	errs := make([]error, len(peers))
	var wg sync.WaitGroup
	for i, m := range peers {
		if m.Reach == 0 {
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
