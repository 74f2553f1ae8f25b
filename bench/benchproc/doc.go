// Package benchproc finds and signals the processes a bench started: a process tree, the workers
// of a gorun agent (by the run id in their environment, whatever their command line), and every
// process that carries the bench's marker variable.
package benchproc
