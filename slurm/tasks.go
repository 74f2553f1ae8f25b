package slurm

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseTasksPerNode expands SLURM's compressed per-node counts, as found in
// SLURM_TASKS_PER_NODE, SLURM_STEP_TASKS_PER_NODE and SLURM_JOB_CPUS_PER_NODE, into one
// entry per node: "2(x3),1" is [2 2 2 1]. Each comma-separated item is a count N or N(xM),
// N repeated M >= 1 times, with decimal N and M and no spaces. It returns an error naming
// the input and the bad item for anything else, including an empty string, and when the
// list would have more than MaxHosts entries.
func ParseTasksPerNode(s string) ([]int, error) {
	counts, reason := parseCounts(s)
	if reason != "" {
		return nil, fmt.Errorf("slurm: tasks per node %q: %s", s, reason)
	}
	return counts, nil
}

// parseCounts does ParseTasksPerNode's work; it returns what is wrong as a reason.
func parseCounts(s string) ([]int, string) {
	fail := func(format string, args ...any) ([]int, string) {
		return nil, fmt.Sprintf(format, args...)
	}
	if s == "" {
		return fail("empty")
	}
	var counts []int
	for item := range strings.SplitSeq(s, ",") {
		countS, repS, repeated := strings.Cut(item, "(x")
		reps := 1
		if repeated {
			r, ok := strings.CutSuffix(repS, ")")
			if !ok || !allDigits(r) {
				return fail("item %q: want N or N(xM)", item)
			}
			n, err := strconv.Atoi(r)
			if err != nil {
				return fail("item %q: repeat count too large", item)
			}
			if n < 1 {
				return fail("item %q: repeat count must be at least 1", item)
			}
			reps = n
		}
		if !allDigits(countS) {
			return fail("item %q: want N or N(xM)", item)
		}
		count, err := strconv.Atoi(countS)
		if err != nil {
			return fail("item %q: count too large", item)
		}
		if reps > MaxHosts-len(counts) {
			return fail("more than %d nodes", MaxHosts)
		}
		for range reps {
			counts = append(counts, count)
		}
	}
	return counts, ""
}
