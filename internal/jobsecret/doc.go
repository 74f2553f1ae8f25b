// Package jobsecret is a job's shared secret: how it is given
// (GORUN_JOB_SECRET, a file readable only by its owner), made, kept out of
// output, and turned into one key per use.
package jobsecret
