package replica

import "testing"

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
