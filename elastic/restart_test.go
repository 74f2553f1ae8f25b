package elastic

import (
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/require"
)

func TestRestartPacer(t *testing.T) {
	fast, healthy := time.Second, HealthyAfter
	tests := []struct {
		name   string
		ranFor []time.Duration
		want   []time.Duration
	}{
		{"a first failure restarts at once", []time.Duration{fast}, []time.Duration{0}},
		{"failing fast backs off", []time.Duration{fast, fast, fast, fast}, []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}},
		{"a healthy round resets it", []time.Duration{fast, fast, healthy, fast}, []time.Duration{0, 100 * time.Millisecond, 0, 100 * time.Millisecond}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := backoff.NewExponentialBackOff()
			b.InitialInterval, b.RandomizationFactor, b.Multiplier, b.MaxElapsedTime = 100*time.Millisecond, 0, 2, 0
			p := newRestartPacer(b)
			var got []time.Duration
			for _, d := range tc.ranFor {
				got = append(got, p.Delay(d))
			}
			require.Equal(t, tc.want, got)
		})
	}
}

func TestTransitions(t *testing.T) {
	tests := []struct {
		from, to State
		ok       bool
	}{
		{StateInit, StateRendezvous, true},
		{StateRendezvous, StateRunning, true},
		{StateRunning, StateStopping, true},
		{StateStopping, StateRendezvous, true},
		{StateRunning, StateSucceeded, true},
		{StateRendezvous, StateFailed, true},
		{StateSucceeded, StateRunning, false},
		{StateFailed, StateRendezvous, false},
		{StateInit, StateRunning, false},
		{StateStopping, StateRunning, false},
	}
	for _, tc := range tests {
		t.Run(tc.from.String()+"->"+tc.to.String(), func(t *testing.T) {
			err := checkTransition(tc.from, tc.to)
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
		})
	}
}
