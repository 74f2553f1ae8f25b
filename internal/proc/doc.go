// Package proc starts worker processes in their own process groups, signals and stops those groups,
// and reaps each process from the one goroutine that started it.
package proc
