package trainer

import (
	"context"
	"fmt"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/internal/distenv"
	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/hsdp"
	"github.com/gorun/gorun/trainer/recovery"
)

// TestPhaseTransitions walks every event from every phase: the edges of
// the table of phase with the data they set, and the refused ones, which
// leave the state as it was.
func TestPhaseTransitions(t *testing.T) {
	own := []recovery.Slice{{Step: 7, Lo: 0, Hi: 4}, {Step: 6, Lo: 0, Hi: 4}}
	held := []recovery.Slice{{Step: 3, Lo: 4, Hi: 8}}
	from := map[phase]recoveryState{
		fresh:   {},
		live:    {phase: live, done: 5, round: 1},
		updated: {phase: updated, done: 6, round: 1},
		carried: {phase: carried, done: 3, round: 0, carried: held},
	}
	var (
		run      = event{kind: started, step: 9, round: 2}
		keep     = event{kind: kept}
		complete = event{kind: completed, step: 7}
		setTo    = event{kind: set, step: 4, round: 2}
		empty    = event{kind: emptied}
		reform   = event{kind: reformed, own: own}
		reuse    = event{kind: reused}
		load     = event{kind: loaded, own: held}
	)
	refused := recoveryState{phase: -1} // marks an edge the table refuses
	tests := []struct {
		from phase
		e    event
		want recoveryState
	}{
		{fresh, run, recoveryState{phase: live, done: 9, round: 2}},
		{live, run, recoveryState{phase: live, done: 5, round: 2}},
		{updated, run, recoveryState{phase: updated, done: 6, round: 2}},
		{carried, run, refused},

		{fresh, keep, refused},
		{live, keep, recoveryState{phase: updated, done: 5, round: 1}},
		{updated, keep, recoveryState{phase: updated, done: 6, round: 1}},
		{carried, keep, refused},

		{fresh, complete, refused},
		{live, complete, refused},
		{updated, complete, recoveryState{phase: updated, done: 7, round: 1}},
		{carried, complete, refused},

		{fresh, setTo, recoveryState{phase: live, done: 4, round: 2}},
		{live, setTo, recoveryState{phase: live, done: 4, round: 2}},
		{updated, setTo, recoveryState{phase: live, done: 4, round: 2}},
		{carried, setTo, recoveryState{phase: live, done: 4, round: 2}},

		{fresh, empty, recoveryState{}},
		{live, empty, recoveryState{}},
		{updated, empty, recoveryState{}},
		{carried, empty, recoveryState{}},

		{fresh, reform, recoveryState{phase: carried, done: -1}},
		{live, reform, recoveryState{phase: carried, done: 5, round: 1, carried: own}},
		{updated, reform, recoveryState{phase: carried, done: 6, round: 1, carried: own}},
		{carried, reform, recoveryState{phase: carried, done: 3, round: 0, carried: held}},

		{fresh, reuse, refused},
		{live, reuse, recoveryState{phase: live, done: 5, round: 1}},
		{updated, reuse, recoveryState{phase: live, done: 6, round: 1}},
		{carried, reuse, refused},

		{fresh, load, recoveryState{phase: carried, done: -1, carried: held}},
		{live, load, refused},
		{updated, load, refused},
		{carried, load, refused},
	}
	seen := map[[2]int]bool{}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%v %v", tc.from, tc.e.kind), func(t *testing.T) {
			seen[[2]int{int(tc.from), int(tc.e.kind)}] = true
			s := from[tc.from]
			got, err := s.next(tc.e)
			if tc.want.phase == refused.phase {
				require.EqualError(t, err, fmt.Sprintf("%v refused in phase %v", tc.e.kind, tc.from))
				require.Equal(t, s, got, "a refused event changes nothing")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	require.Len(t, seen, 4*8, "every event from every phase")
	_, err := recoveryState{phase: live}.next(event{kind: eventKind(99)})
	require.EqualError(t, err, "eventKind(99) refused in phase live")
}

// TestRunRefusedWhileCarried: after a Reform whose Exchange failed, the
// rank's buffers are fresh and what it holds is carried: Run refuses to
// start, and the next Reform recovers the carried step.
func TestRunRefusedWhileCarried(t *testing.T) {
	cfg := reformConfig(t, config.ModeDDP)
	tr := stoppingAtStep3(t, cfg)
	one := distenv.Worker{WorldSize: 1, LocalWorldSize: 1}
	require.Equal(t, fresh, tr.recovery.phase)
	_, err := tr.Run(context.Background())
	require.ErrorIs(t, err, errBoundary)
	require.Equal(t, recoveryState{phase: updated, done: 3}, tr.recovery)

	_, err = tr.Reform(context.Background(), one, []recovery.Slice{{Step: 1, Lo: 0, Hi: 2}})
	require.ErrorContains(t, err, "trainer: reform: trainer: exchange: extra holding 0: elements [0, 2) but 0 params")
	require.Equal(t, carried, tr.recovery.phase)
	require.Equal(t, 3, tr.recovery.done)
	steps := []int64{}
	for _, h := range tr.recovery.carried {
		steps = append(steps, h.Step)
	}
	require.Equal(t, []int64{3, 2}, steps, "the owned state and the rollback copy")
	_, err = tr.Run(context.Background())
	require.EqualError(t, err, "trainer: run: started refused in phase carried (the last Reform failed: Reform again or Close)")

	rec, err := tr.Reform(context.Background(), one, nil)
	require.NoError(t, err)
	require.Equal(t, Recovery{Source: recovery.Peers, Step: 3}, withoutTook(rec))
	require.Equal(t, recoveryState{phase: live, done: 3}, tr.recovery)
}

// TestGradSumInRollbackMemory: the layouts whose ranks can give the copy
// up before the backward pass (one replica, or one shard per replica)
// keep the step's gradient sum in the copy's memory, 12 bytes an element
// for both; the others keep them apart.
func TestGradSumInRollbackMemory(t *testing.T) {
	tests := []struct {
		replicas, shards int
		shared           bool
	}{
		{1, 1, true}, {4, 1, true}, {1, 4, true}, {2, 2, false}, {2, 4, false},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%dx%d", tc.replicas, tc.shards), func(t *testing.T) {
			shared := sharesGradSum(hsdp.Plan{Replicas: tc.replicas, Shards: tc.shards})
			require.Equal(t, tc.shared, shared)
			for _, n := range []int{0, 1, 5, 6} {
				sum, rb := sumAndRollback(n, shared)
				require.Len(t, sum, n)
				keep := rb.buffers(n)
				require.Len(t, keep.Params, n)
				require.Len(t, keep.M, n)
				require.Len(t, keep.V, n)
				if n == 0 {
					continue
				}
				first := unsafe.Pointer(&sum[0])
				require.Equal(t, shared, first == unsafe.Pointer(&keep.Params[0]), "the copy's params start where the sum does")
				if shared {
					end := uintptr(first) + uintptr(8*n)
					require.Equal(t, uintptr(first)+uintptr(4*n), uintptr(unsafe.Pointer(&keep.M[0])))
					require.Equal(t, uintptr(first)+uintptr(8*n), uintptr(unsafe.Pointer(&keep.V[0])))
					require.LessOrEqual(t, end, uintptr(unsafe.Pointer(&keep.V[n-1]))+4, "the sum lies within the copy")
				}
			}
		})
	}
}
