// Package worldtest starts in-process worlds for the trainer's tests: several ranks in one
// process, each in its own goroutine, meeting over loopback sockets as the workers of a job do.
//
// It imports neither package trainer nor package comm, so that their own (internal) tests can
// use it: a test says how a rank connects or trains, and worldtest gives every rank its worker
// contract, runs the ranks at once and closes what they opened.
package worldtest
