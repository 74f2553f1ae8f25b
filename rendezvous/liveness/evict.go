package liveness

import "time"

// EvictionClock tells when a node has been the job's straggler for long
// enough to evict it: without a break, from the first look that found
// it one.
type EvictionClock struct {
	After time.Duration // how long a straggler may stay one
	// Since is when the node became the straggler; zero: it is not. Set it
	// to now to start the period again.
	Since time.Time
}

// Observe records whether the node was a straggler at now and says
// whether it has been one for at least After.
func (c *EvictionClock) Observe(now time.Time, straggling bool) bool {
	if !straggling {
		c.Since = time.Time{}
		return false
	}
	if c.Since.IsZero() {
		c.Since = now
	}
	return now.Sub(c.Since) >= c.After
}
