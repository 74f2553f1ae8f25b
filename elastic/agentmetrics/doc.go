// Package agentmetrics exports one gorun agent's job, rounds and workers
// as Prometheus metrics on its own registry, and serves them over HTTP.
package agentmetrics
