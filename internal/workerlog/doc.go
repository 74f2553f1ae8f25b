// Package workerlog routes each worker's stdout and stderr to gorun's console as whole lines
// prefixed with [host:rank], to per-rank log files, and to an in-memory tail of stderr for failure
// reports.
package workerlog
