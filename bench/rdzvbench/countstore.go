package main

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/gorun/gorun/rendezvous"
)

// storeCounts counts what the agents of one round asked of etcd, summed
// over agents.
type storeCounts struct {
	Lists, Watches, Events, Puts, Deletes atomic.Int64
	CAS, CASWon                           atomic.Int64
	CASBytes                              atomic.Int64
}

// countingStore is a rendezvous.Store that counts its calls into counts.
type countingStore struct {
	rendezvous.Store
	counts *storeCounts
}

func (s countingStore) List(ctx context.Context, prefix string) ([]rendezvous.KV, int64, error) {
	s.counts.Lists.Add(1)
	return s.Store.List(ctx, prefix)
}

func (s countingStore) Txn(ctx context.Context, guard string, rev int64, writes ...rendezvous.KV) (bool, error) {
	s.counts.CAS.Add(1)
	for _, w := range writes {
		s.counts.CASBytes.Add(int64(len(w.Value)))
	}
	won, err := s.Store.Txn(ctx, guard, rev, writes...)
	if won {
		s.counts.CASWon.Add(1)
	}
	return won, err
}

func (s countingStore) Put(ctx context.Context, key string, value []byte, leased bool) error {
	s.counts.Puts.Add(1)
	return s.Store.Put(ctx, key, value, leased)
}

func (s countingStore) Delete(ctx context.Context, key string) error {
	s.counts.Deletes.Add(1)
	return s.Store.Delete(ctx, key)
}

func (s countingStore) Watch(ctx context.Context, prefix string, rev int64) <-chan rendezvous.Event {
	s.counts.Watches.Add(1)
	in := s.Store.Watch(ctx, prefix, rev)
	out := make(chan rendezvous.Event)
	go func() {
		defer close(out)
		for ev := range in {
			s.counts.Events.Add(1)
			select {
			case out <- ev:
			case <-ctx.Done():
				// Drain so the inner watch's goroutine can end.
				for range in {
				}
				return
			}
		}
	}()
	return out
}

// String is one line of the counts.
func (c *storeCounts) String() string {
	return fmt.Sprintf("lists %d, watches %d, events %d, puts %d, deletes %d, cas %d (won %d, %d KiB sent)",
		c.Lists.Load(), c.Watches.Load(), c.Events.Load(), c.Puts.Load(), c.Deletes.Load(), c.CAS.Load(), c.CASWon.Load(), c.CASBytes.Load()>>10)
}
