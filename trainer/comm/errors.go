package comm

import (
	"errors"
	"fmt"
)

// ErrClosed is returned by collectives on a World that was closed.
var ErrClosed = errors.New("comm: world closed")

// ErrAborted is in the chain of every error of a World after Abort: its
// round ended, and this rank was told so instead of waiting on a peer.
var ErrAborted = errors.New("comm: world aborted")

// PeerError says which peer rank made an operation fail: it died, stalled
// past the timeout, closed its World, or disagreed about the collective.
type PeerError struct {
	Rank int    // the peer's global rank
	Op   string // what this rank was doing: connect, allreduce, ...
	Err  error  // what happened
}

// Error says what this rank was doing and which peer made it fail.
func (e *PeerError) Error() string {
	return fmt.Sprintf("comm: %s: peer rank %d: %v", e.Op, e.Rank, e.Err)
}

// Unwrap returns what happened, for errors.Is and errors.As.
func (e *PeerError) Unwrap() error { return e.Err }
