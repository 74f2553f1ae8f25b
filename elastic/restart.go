package elastic

import (
	"time"

	"github.com/cenkalti/backoff/v4"
)

// HealthyAfter is how long a round must run before the next failure
// counts as a first failure again: a worker that keeps failing faster
// than this is backed off.
const HealthyAfter = 10 * time.Second

// restartPacer says how long to wait before rejoining after a worker
// failure: nothing for a first failure, so a crash costs no more than the
// restart itself; then, for workers that keep failing within
// HealthyAfter of their start, the delays of a back-off, which a healthy
// round resets.
type restartPacer struct {
	backOff     backoff.BackOff
	fastFailing int // failures in a row, each within HealthyAfter of its round's start
}

func newRestartPacer(b backoff.BackOff) *restartPacer {
	b.Reset()
	return &restartPacer{backOff: b}
}

// Delay records a failure of a round that ran for ranFor and returns the
// wait before the next round.
func (p *restartPacer) Delay(ranFor time.Duration) time.Duration {
	if ranFor >= HealthyAfter {
		p.fastFailing = 0
		p.backOff.Reset()
	}
	p.fastFailing++
	if p.fastFailing == 1 {
		return 0
	}
	d := p.backOff.NextBackOff()
	if d == backoff.Stop {
		return 0
	}
	return d
}
