package comm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTimeoutRule(t *testing.T) {
	rule := TimeoutRule{Floor: 10 * time.Second, Factor: 10, Ceiling: 2 * time.Minute}
	for _, tc := range []struct {
		name   string
		rule   TimeoutRule
		median time.Duration
		ok     bool
		want   time.Duration
	}{
		{"no step yet: the ceiling", rule, 0, false, 2 * time.Minute},
		{"fast steps: the floor", rule, 50 * time.Millisecond, true, 10 * time.Second},
		{"factor x median", rule, 3 * time.Second, true, 30 * time.Second},
		{"slow steps: the ceiling", rule, time.Minute, true, 2 * time.Minute},
		{"no overflow", rule, time.Duration(1 << 62), true, 2 * time.Minute},
		{"floor above ceiling: the ceiling", TimeoutRule{Floor: time.Minute, Factor: 10, Ceiling: 5 * time.Second}, time.Millisecond, true, 5 * time.Second},
		{"zero rule: the defaults", TimeoutRule{}, 2 * time.Second, true, 20 * time.Second},
		{"zero rule, fast steps", TimeoutRule{}, time.Millisecond, true, DefaultFloor},
		{"zero rule, no step", TimeoutRule{}, 0, false, DefaultTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.rule.For(tc.median, tc.ok))
		})
	}
}

func TestStepTimesMedian(t *testing.T) {
	var s StepTimes
	_, ok := s.Median()
	require.False(t, ok)
	s.Add(3 * time.Second)
	m, ok := s.Median()
	require.True(t, ok)
	require.Equal(t, 3*time.Second, m)
	s.Add(time.Second)
	s.Add(100 * time.Second) // one slow step does not move it far
	m, _ = s.Median()
	require.Equal(t, 3*time.Second, m)
	for range stepWindow { // the window forgets the oldest steps
		s.Add(time.Second)
	}
	m, _ = s.Median()
	require.Equal(t, time.Second, m)
	s.Add(-time.Second)
	m, _ = s.Median()
	require.Equal(t, time.Second, m)
	s.Reset()
	_, ok = s.Median()
	require.False(t, ok)
}
