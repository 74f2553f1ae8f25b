// Package metrics reports training progress: the log line rank 0 prints
// every log_every steps and the JSON-lines file of per-step figures.
package metrics
