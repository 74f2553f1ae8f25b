package replica

// Why a lag matters: a worker keeps its two newest steps (N and N-1) in
// its slots, and a peer the two newest it was sent. The agents restore
// the newest step that every rank holds somewhere, so when a node is lost
// while its ranks' copies on the peer are older than N-1, the survivors
// hold no step in common with them: the job falls back to the durable
// directory or the script's own checkpoint, not to a step or two before.

// lagChange is what a copy about to be sent says about a rank's copies on
// one peer.
type lagChange int

const (
	lagSame     lagChange = iota // no change worth saying
	lagBehind                    // the peer's newest copy fell more than a step behind the worker
	lagCaughtUp                  // the peer had the step before again
)

// lagWatch follows the steps of one rank sent to one peer. Its zero value
// has sent nothing.
type lagWatch struct {
	sent   uint64 // the newest step the peer stored
	has    bool   // whether the peer stored one this round
	behind bool   // whether the last check found the peer behind
}

// check is told that step is the worker's newest complete step, about to
// be sent: the peer holds w.sent meanwhile. The peer is behind when it
// holds a step older than step-1, so that the worker's two slots (step and
// step-1) share no step with it. A step not newer than the one sent (the
// job restored an older one) starts the count again. It returns the change
// since the last check.
func (w lagWatch) check(step uint64) (lagWatch, lagChange) {
	behind := w.has && step > w.sent && step-w.sent > 1
	change := lagSame
	switch {
	case behind && !w.behind:
		change = lagBehind
	case !behind && w.behind:
		change = lagCaughtUp
	}
	w.behind = behind
	return w, change
}

// stored records that the peer stored step.
func (w lagWatch) stored(step uint64) lagWatch {
	w.sent, w.has = step, true
	return w
}
