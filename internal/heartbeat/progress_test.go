package heartbeat

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestParseLine(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		line string
		want Progress
		err  string
	}{
		{line: "12", want: Progress{Step: 12, Loss: nan, TokensPerS: nan, MFU: nan, ComputeS: nan, Round: nan, Redone: nan, StateS: nan}},
		{line: " 12 \n", want: Progress{Step: 12, Loss: nan, TokensPerS: nan, MFU: nan, ComputeS: nan, Round: nan, Redone: nan, StateS: nan}},
		{line: "12 loss=3.41 tokens_per_s=5123.4 mfu=0.31", want: Progress{Step: 12, Loss: 3.41, TokensPerS: 5123.4, MFU: 0.31, ComputeS: nan, Round: nan, Redone: nan, StateS: nan}},
		{line: "12 compute_s=0.27", want: Progress{Step: 12, Loss: nan, TokensPerS: nan, MFU: nan, ComputeS: 0.27, Round: nan, Redone: nan, StateS: nan}},
		{line: "13 round=2 redone=433", want: Progress{Step: 13, Loss: nan, TokensPerS: nan, MFU: nan, ComputeS: nan, Round: 2, Redone: 433, StateS: nan}},
		{line: "13 redone=2 state_s=0.75", want: Progress{Step: 13, Loss: nan, TokensPerS: nan, MFU: nan, ComputeS: nan, Round: nan, Redone: 2, StateS: 0.75}},
		{line: "12 compute_s=slow", err: `line "12 compute_s=slow": compute_s`},
		{line: "12 loss=2 future=7 bare", want: Progress{Step: 12, Loss: 2, TokensPerS: nan, MFU: nan, ComputeS: nan, Round: nan, Redone: nan, StateS: nan}},
		{line: "12 loss=NaN", want: Progress{Step: 12, Loss: nan, TokensPerS: nan, MFU: nan, ComputeS: nan, Round: nan, Redone: nan, StateS: nan}},
		{line: "", err: "empty line"},
		{line: "step 12", err: `line "step 12": step`},
		{line: "12 loss=high", err: `line "12 loss=high": loss`},
	} {
		t.Run(tc.line, func(t *testing.T) {
			got, err := ParseLine(tc.line)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want.Line(), got.Line())
			require.Equal(t, tc.want.Step, got.Step)
		})
	}
}

func TestLineRoundTrips(t *testing.T) {
	for _, p := range []Progress{
		Unreported(0),
		{Step: 7, Loss: 1.25, TokensPerS: 1e6, MFU: 0.5, ComputeS: 0.125},
		{Step: 8, Loss: 0, TokensPerS: math.NaN(), MFU: 0, ComputeS: math.NaN()},
		{Step: 9, Loss: math.NaN(), TokensPerS: math.NaN(), MFU: math.NaN(), ComputeS: math.NaN(), Round: 3, Redone: 0},
	} {
		got, err := ParseLine(p.Line())
		require.NoError(t, err)
		require.Equal(t, p.Line(), got.Line())
	}
	require.Equal(t, "3\n", Unreported(3).Line(), "a heartbeat without figures is the step alone, as before")
}

// TestWatchReportsBeats: with a timeout of 0 the pipe judges no stall
// and passes every heartbeat to OnBeat, in order, until the worker end
// closes.
func TestWatchReportsBeats(t *testing.T) {
	defer goleak.VerifyNone(t)
	p, err := NewPipe()
	require.NoError(t, err)
	var got []Progress
	p.OnBeat(func(prog Progress) { got = append(got, prog) })
	stalls := p.Watch(context.Background(), 0)
	defer p.Close()
	b := &Beater{f: p.WorkerEnd()} // the worker's side, in this process
	b.Beat(1)
	b.Report(Progress{Step: 2, Loss: 3.5, TokensPerS: 100, MFU: math.NaN(), ComputeS: math.NaN(), Round: math.NaN(), Redone: math.NaN(), StateS: math.NaN()})
	require.NoError(t, p.CloseWorkerEnd())
	_, stalled := <-stalls
	require.False(t, stalled)
	require.Len(t, got, 2)
	require.Equal(t, "1\n", got[0].Line())
	require.Equal(t, "2 loss=3.5 tokens_per_s=100\n", got[1].Line())
	require.False(t, p.LastBeat().IsZero())
}
