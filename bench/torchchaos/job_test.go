package main

import (
	"testing"
	"time"
)

// The gaps before failures spread over half a period to one and a half,
// and every way draws the same sequence for a seed.
func TestGapsSpreadOverAPeriod(t *testing.T) {
	b := &bench{period: 20 * time.Second, seed: 1, dir: t.TempDir()}
	a, err := newJob(b, way{Name: "a"}, "a", true)
	if err != nil {
		t.Fatal(err)
	}
	c, err := newJob(b, way{Name: "c"}, "c", true)
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := b.period, time.Duration(0)
	for range 200 {
		g := a.gap()
		if g < b.period/2 || g >= 3*b.period/2 {
			t.Fatalf("gap %v outside [%v, %v)", g, b.period/2, 3*b.period/2)
		}
		if other := c.gap(); other != g {
			t.Fatalf("two ways drew %v and %v: want the same sequence", g, other)
		}
		lo, hi = min(lo, g), max(hi, g)
	}
	if hi-lo < b.period*3/4 {
		t.Errorf("200 gaps within %v..%v: want them spread over the period", lo, hi)
	}
}
