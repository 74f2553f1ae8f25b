package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
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

// jsonLine marshals v as one line (the JSON=1 output).
func jsonLine(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		return `{"error":` + strconv.Quote(err.Error()) + `}`
	}
	return string(data)
}

// msFloat is d in milliseconds, to 0.1 ms.
func msFloat(d time.Duration) float64 {
	return float64(d.Round(100*time.Microsecond)) / float64(time.Millisecond)
}

// cpuString formats CPU seconds; "?" when unknown (negative).
func cpuString(s float64) string {
	if s < 0 {
		return "?"
	}
	return fmt.Sprintf("%.2f", s)
}

// mibString formats a byte count in MiB; "?" when unknown (negative).
func mibString(n int64) string {
	if n < 0 {
		return "?"
	}
	return fmt.Sprintf("%.1f", float64(n)/(1<<20))
}
