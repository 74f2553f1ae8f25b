package main

import (
	"fmt"
	"slices"
	"time"
)

// summary is the median, min and max of a set of samples.
type summary struct {
	N                int
	Median, Min, Max time.Duration
}

// summarize returns the summary of samples; the zero summary when there
// are none.
func summarize(samples []time.Duration) summary {
	if len(samples) == 0 {
		return summary{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return summary{N: len(s), Median: m, Min: s[0], Max: s[len(s)-1]}
}

// ms formats d in milliseconds with one decimal.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond))
}

// verdict says whether a goal is met.
func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}
