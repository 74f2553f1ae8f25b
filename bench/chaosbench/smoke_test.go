package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCheckInjected: the smoke verdict fails a chaos run that injected nothing, skipped a
// fault, never injected a kind, or did not recover from a fault, and passes one that injected
// every kind and recovered from each.
func TestCheckInjected(t *testing.T) {
	every := func() []fault {
		var fs []fault
		for _, k := range kinds {
			fs = append(fs, fault{Kind: k, Victim: "node1"})
		}
		return fs
	}
	costsOf := func(fs []fault) []faultCost {
		var cs []faultCost
		for _, f := range fs {
			if f.Skipped == "" {
				cs = append(cs, faultCost{fault: f})
			}
		}
		return cs
	}
	for _, tc := range []struct {
		name    string
		faults  []fault
		costs   func([]fault) []faultCost
		wantErr string // "" passes
	}{
		{"every kind injected and recovered from", every(), costsOf, ""},
		{"no fault drawn", nil, costsOf, "no fault injected (0 drawn)"},
		{"every fault skipped", func() []fault {
			fs := every()
			for i := range fs {
				fs[i].Skipped = "no node with workers"
			}
			return fs
		}(), costsOf, "no fault injected (5 drawn)"},
		{"one kind skipped", func() []fault {
			fs := every()
			fs[0].Skipped = "no node with workers"
			return fs
		}(), costsOf, kindWorker + " skipped: no node with workers"},
		{"one kind never drawn", every()[1:], costsOf, "never injected: " + kindWorker},
		{"one fault not recovered from", every(), func(fs []fault) []faultCost {
			cs := costsOf(fs)
			cs[2].Unrecovered = true
			return cs
		}, "not recovered: " + kindStop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkInjected(tc.faults, tc.costs(tc.faults))
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}
