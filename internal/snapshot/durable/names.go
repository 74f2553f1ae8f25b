package durable

import (
	"fmt"
	"strconv"
	"strings"
)

// The layout of a durable directory:
//
//	<dst>/step-<12 digits>/rank-<R>.slot   the slot file as it was
//	<dst>/step-<12 digits>/.rank-<R>.slot.tmp-*   a copy being written
const (
	stepPrefix = "step-"
	slotPrefix = "rank-"
	slotSuffix = ".slot"
	tmpInfix   = ".tmp-"
)

// stepDir returns the name of step's directory.
func stepDir(step uint64) string { return fmt.Sprintf("%s%012d", stepPrefix, step) }

// slotName returns the name of rank's file in a step directory.
func slotName(rank int) string { return slotPrefix + strconv.Itoa(rank) + slotSuffix }

// tmpPattern is the os.CreateTemp pattern of a copy of rank being written:
// a hidden name that Scan and a reader of the layout never take for a slot.
func tmpPattern(rank int) string { return "." + slotName(rank) + tmpInfix + "*" }

// isTmpOf reports whether name is a temporary copy of rank.
func isTmpOf(name string, rank int) bool {
	return strings.HasPrefix(name, "."+slotName(rank)+tmpInfix)
}

// parseStepDir returns the step of a directory named as stepDir names it,
// and whether name is one.
func parseStepDir(name string) (uint64, bool) {
	num, ok := strings.CutPrefix(name, stepPrefix)
	if !ok {
		return 0, false
	}
	step, err := strconv.ParseUint(num, 10, 64)
	return step, err == nil && stepDir(step) == name
}

// parseSlotName returns the rank of a file named as slotName names it, and
// whether name is one.
func parseSlotName(name string) (int, bool) {
	num, ok := strings.CutPrefix(name, slotPrefix)
	if !ok {
		return 0, false
	}
	num, ok = strings.CutSuffix(num, slotSuffix)
	if !ok {
		return 0, false
	}
	rank, err := strconv.Atoi(num)
	return rank, err == nil && rank >= 0 && slotName(rank) == name
}
