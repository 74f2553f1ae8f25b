package elastic

import "context"

// Round is one formation of the job: who this node is in it and where
// worker rank 0 hosts the store.
type Round struct {
	NodeRank   int
	NumNodes   int
	MasterAddr string
	MasterPort int
}

// Rendezvous forms the rounds of a job.
type Rendezvous interface {
	// Next blocks until the next round is formed or ctx ends (then it
	// returns ctx's error). restart counts the rounds formed before.
	Next(ctx context.Context, restart int) (Round, error)
}

// Static is torchrun's static rendezvous: every node knows the whole job
// up front (node count, its own rank, the master), so every round is the
// same and forming one waits for nothing.
type Static Round

// Next returns the fixed round at once.
func (s Static) Next(ctx context.Context, _ int) (Round, error) {
	return Round(s), ctx.Err()
}
