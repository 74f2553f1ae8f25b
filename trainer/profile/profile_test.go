package profile

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPhaseNames(t *testing.T) {
	for p := range NumPhases {
		require.NotContains(t, p.String(), "phase(", "phase %d has a name", int(p))
	}
	require.Equal(t, "phase(6)", NumPhases.String())
	require.Equal(t, "phase(-1)", Phase(-1).String())
}

func TestTimerPhasesAddUpToTheStep(t *testing.T) {
	tm := NewTimer(time.Now())
	for range 3 {
		tm.Lap(GEMM)
		tm.Lap(Attention)
		tm.Lap(Collectives)
		end := time.Now()
		st := tm.EndStep(end)
		var sum time.Duration
		for p, d := range st.Phases {
			require.GreaterOrEqual(t, d, time.Duration(0), "phase %v", Phase(p))
			sum += d
		}
		require.Equal(t, st.Total, sum)
	}
}

func TestNilTimerDoesNothing(t *testing.T) {
	var tm *Timer
	tm.Lap(GEMM)
	require.Equal(t, Step{}, tm.EndStep(time.Now()))
}

func TestSummaryTable(t *testing.T) {
	var s Summary
	st := Step{Total: 4 * time.Second}
	st.Phases[GEMM] = 3 * time.Second
	st.Phases[Waiting] = time.Second
	s.Add(st)
	s.Add(st)
	var b bytes.Buffer
	require.NoError(t, s.WriteTable(&b))
	out := b.String()
	require.Contains(t, out, "profile: 2 steps")
	require.Regexp(t, `gemm\s+6\.000\s+3000\.00\s+75\.0%`, out)
	require.Regexp(t, `step\s+8\.000\s+4000\.00\s+100\.0%`, out)
	for p := range NumPhases {
		require.Contains(t, out, p.String())
	}
}

// BenchmarkLap is the cost of one lap with profiling on (a clock read);
// BenchmarkLapOff the cost with it off (a nil check).
func BenchmarkLap(b *testing.B) {
	tm := NewTimer(time.Now())
	for range b.N {
		tm.Lap(GEMM)
	}
}

func BenchmarkLapOff(b *testing.B) {
	var tm *Timer
	for range b.N {
		tm.Lap(GEMM)
	}
}
