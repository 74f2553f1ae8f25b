package liveness

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEvictionClock(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	type look struct {
		at         int // seconds
		straggling bool
		evict      bool
	}
	for _, tc := range []struct {
		name  string
		looks []look
	}{
		{"never a straggler", []look{{0, false, false}, {2, false, false}, {100, false, false}}},
		{"a straggler for the whole period", []look{{0, true, false}, {2, true, false}, {9, true, false}, {10, true, true}}},
		{"a break starts the period again", []look{{0, true, false}, {8, false, false}, {10, true, false}, {18, true, false}, {20, true, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := EvictionClock{After: 10 * time.Second}
			for _, l := range tc.looks {
				require.Equal(t, l.evict, c.Observe(at(l.at), l.straggling), "at %d s", l.at)
			}
		})
	}
}
