package elastic

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/rendezvous"
)

// firstSnapshot, which starts the next warm workers, fires on a snapshot
// of the node's local rank 0 completed after it was called, and not on the
// one already there (the step the round restored), nor on another rank's.
func TestFirstSnapshotIsANewOneOfLocalRankZero(t *testing.T) {
	dir := t.TempDir()
	a, err := New(Spec{LocalWorkers: 2, Command: []string{"true"}, ErrorDir: t.TempDir(), Log: zerolog.Nop(),
		Snapshots: &Snapshots{Dir: dir}}, &rendezvous.Static{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writeSlot(t, dir, 2, 4, 48, true) // restored
	first := a.firstSnapshot(ctx, 2)
	writeSlot(t, dir, 3, 4, 49, true) // another rank's
	select {
	case <-first:
		t.Fatal("fired for the restored step or another rank's snapshot")
	case <-time.After(2 * time.Second): // past one safety poll: an event it must not have seen
	}
	writeSlot(t, dir, 2, 4, 49, true)
	select {
	case <-first:
	case <-time.After(time.Minute):
		t.Fatal("no event for local rank 0's new snapshot")
	}
}
