package trainer

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// blockedOp queues on s a collective that runs until the returned
// function is called (with the error it returns).
func blockedOp(s *stream) (*streamOp, func(error)) {
	release := make(chan error)
	op := s.queue(func() error { return <-release })
	return op, func(err error) { release <- err }
}

// TestUnitBuffersLendInTurn walks three buffers through a sharded
// backward pass's order: the pass reads one unit, the next is being
// gathered, and the block gradient before is still being reduced when
// the pass asks for the next gradient buffer. The gather takes the buffer
// of the reduction (the stream runs it after that reduction), so the pass
// finds a buffer it need not wait for.
func TestUnitBuffersLendInTurn(t *testing.T) {
	var s stream
	var timer collectiveTimer
	p := newUnitBuffers(3, 4)
	reading := p.forStream()   // unit u+1, gathered and read by the pass
	gathering := p.forStream() // unit u, being gathered
	grad, err := p.forPass(&timer)
	require.NoError(t, err)
	reduce, finish := blockedOp(&s)
	p.release(grad, reduce) // the pass is done with u+1's gradient; it is being reduced

	// The pass asks for unit u: it is done reading u+1, and u-1's gather
	// is queued behind the reduction.
	p.release(reading, nil)
	reading = gathering
	ahead := p.forStream()
	require.Same(t, grad, ahead, "the gather takes the buffer the reduction still reads")
	next, err := p.forPass(&timer)
	require.NoError(t, err)
	require.NotSame(t, reading, next)
	require.NotSame(t, ahead, next)
	require.False(t, reduce.finished(), "the pass did not wait for the reduction")

	require.PanicsWithValue(t, "trainer: all 3 unit buffers are lent", func() { p.forStream() })
	finish(nil)
	require.NoError(t, s.drain())
}

// TestUnitBuffersPassWaits: when every free buffer is still read by a
// collective, the pass waits for it and gets its error.
func TestUnitBuffersPassWaits(t *testing.T) {
	tests := []struct {
		name string
		err  error
	}{
		{"the reduction succeeds", nil},
		{"the reduction fails", errors.New("peer 3 gone")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var s stream
			var timer collectiveTimer
			p := newUnitBuffers(1, 4)
			b, err := p.forPass(&timer)
			require.NoError(t, err)
			reduce, finish := blockedOp(&s)
			p.release(b, reduce)
			go finish(tc.err)
			got, err := p.forPass(&timer)
			require.Same(t, b, got)
			require.Equal(t, tc.err, err)
			require.True(t, reduce.finished())
			require.Equal(t, tc.err, s.drain())
		})
	}
}
