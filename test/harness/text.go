package harness

import (
	"fmt"
	"strings"
)

// Tail returns the last n lines of s, after a line saying how many were left out when any
// were.
func Tail(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1] // s ends with a newline: no line after it
	}
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d lines omitted)\n", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "")
}
