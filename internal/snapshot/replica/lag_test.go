package replica

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A lagWatch fed the steps a pusher sends, in order (each stored by the
// peer), says when the peer falls more than a step behind and when it
// catches up, once each.
func TestLagWatch(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []uint64
		want  []lagChange // one per step
	}{
		{"every step sent", []uint64{1, 2, 3, 4}, []lagChange{lagSame, lagSame, lagSame, lagSame}},
		{"the first copy of a round is never behind", []uint64{7}, []lagChange{lagSame}},
		{"a step skipped: behind, said once", []uint64{1, 3, 5, 7}, []lagChange{lagSame, lagBehind, lagSame, lagSame}},
		{"behind, then caught up", []uint64{1, 3, 4, 5}, []lagChange{lagSame, lagBehind, lagCaughtUp, lagSame}},
		{"the same step again is no lag", []uint64{4, 4, 5}, []lagChange{lagSame, lagSame, lagSame}},
		{"the job restored an older step: counted from there", []uint64{10, 12, 3, 4}, []lagChange{lagSame, lagBehind, lagCaughtUp, lagSame}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w lagWatch
			for i, step := range tc.steps {
				var got lagChange
				w, got = w.check(step)
				if got != tc.want[i] {
					t.Fatalf("step %d (the %dth sent): change %d, want %d", step, i+1, got, tc.want[i])
				}
				w = w.stored(step)
			}
		})
	}
}

// TestLagSaid: a peer held up while the worker saves two more steps gets
// the newest next, more than a step after the one it holds: the pusher
// says, once, that its copies fell behind the worker, and that they keep
// up again when the next step follows the one sent.
func TestLagSaid(t *testing.T) {
	hook, reached, release := midway(0, 2)
	peer := startNode(t, testAuth, hook)
	defer release()
	peer.Accept(1, nil)
	src := newSender(t, t.TempDir())
	src.save(t, 0, 1, 1000)
	plog, sent := pushing(t, 1, src.dir, []int{0}, []string{peer.Addr()}, testAuth)
	waitSent(t, sent, 0, 1)
	src.save(t, 0, 2, 1000)
	<-reached // the copy of step 2 is held at the peer, the pusher waits for its verdict
	src.save(t, 0, 3, 1000)
	src.save(t, 0, 4, 1000) // step 2's slot
	release()
	waitSent(t, sent, 0, 4)
	require.Contains(t, plog.wait(t, "fall behind the worker"), `"step":4`)
	src.save(t, 0, 5, 1000)
	waitSent(t, sent, 0, 5)
	plog.wait(t, "keep up with the worker again")
	require.Equal(t, 1, plog.count("fall behind the worker"), "%v", plog)
}
