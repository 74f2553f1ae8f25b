package launcher

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/elastic/agentmetrics"
	"github.com/gorun/gorun/internal/goodput"
	"github.com/gorun/gorun/rendezvous"
)

// observeGoodput returns what gives this agent's goodput figures: its
// metrics' (--metrics-addr), else those of metrics made for it alone and
// made spec's observer. Nil when spec has an observer of another kind.
func observeGoodput(spec *elastic.Spec, l *Launch) func() goodput.Summary {
	if m, ok := spec.Observer.(*agentmetrics.Metrics); ok {
		return m.Goodput
	}
	if spec.Observer != nil {
		return nil
	}
	m, err := agentmetrics.New(agentmetrics.Config{RunID: l.RunID, Node: l.Host})
	if err != nil {
		return nil // a launch always has both
	}
	spec.Observer = m
	return m.Goodput
}

// goodputFinalTimeout bounds the last write of publishGoodput, after
// its context ended.
const goodputFinalTimeout = 5 * time.Second

// publishGoodput puts this node's goodput figures (of) under its
// goodput key every statsEvery until ctx ends, then once more with
// what the agent's end left: `gorun status` shows them, during the job
// and for as long as its keys are kept after it. A failed write is
// logged and tried again at the next tick.
func publishGoodput(ctx context.Context, store rendezvous.Store, nodeID, host string, of func() goodput.Summary, log zerolog.Logger) {
	if of == nil {
		return
	}
	log = log.With().Str("component", "goodput").Logger()
	put := func(ctx context.Context) {
		s := of()
		if !s.Measured {
			return
		}
		r := goodput.NodeReport{Host: host, At: time.Now(), Summary: s}
		// A put cut short by the end of ctx is not worth a warning: the
		// final put below follows it with a context of its own.
		if err := store.Put(ctx, rendezvous.GoodputKey(nodeID), r.Encode(), false); err != nil && ctx.Err() == nil {
			log.Warn().Err(err).Msg("publishing this node's goodput")
		}
	}
	tick := time.NewTicker(statsEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), goodputFinalTimeout)
			defer cancel()
			put(fctx)
			return
		case <-tick.C:
			put(ctx)
		}
	}
}
