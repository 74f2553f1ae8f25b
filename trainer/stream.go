package trainer

// stream runs the shard group's collectives of a step off the training
// goroutine, one at a time, in the order they were queued: the gather of
// the next unit overlaps the computation of the current one, and a unit's
// reduce-scatter the computation of the unit after it. Every rank queues
// the same collectives in the same order (the model's fixed order of
// units), so they pair up as if run in place. Each queued collective runs
// on a goroutine of its own once the one before it has finished; none is
// left once Drain returns. A stream is used from one goroutine.
type stream struct {
	last *streamOp // the collective queued last, nil when none
}

// streamOp is one queued collective.
type streamOp struct {
	done chan struct{} // closed when run has returned
	err  error         // run's error, once done is closed
}

// queue runs run after every collective queued before it and returns
// its handle. When one before it failed, run is skipped and the op fails
// with that error: no rank goes on with the collectives after a failure,
// and the first error is what every later op reports.
func (s *stream) queue(run func() error) *streamOp {
	op := &streamOp{done: make(chan struct{})}
	prev := s.last
	s.last = op
	go func() {
		defer close(op.done)
		if op.err = prev.wait(); op.err == nil {
			op.err = run()
		}
	}()
	return op
}

// wait waits for op to finish and returns its error; a nil op is done.
func (op *streamOp) wait() error {
	if op == nil {
		return nil
	}
	<-op.done
	return op.err
}

// finished says whether op has finished, without waiting; a nil op has.
func (op *streamOp) finished() bool {
	if op == nil {
		return true
	}
	select {
	case <-op.done:
		return true
	default:
		return false
	}
}

// drain waits for every queued collective and returns the first error
// among them (see queue); the stream is then empty.
func (s *stream) drain() error {
	err := s.last.wait()
	s.last = nil
	return err
}
