// Package slurm parses what SLURM tells a task about its job: hostlists, task counts and the
// SLURM_* environment, and derives the ports a job uses from its id, without talking to SLURM
// and without importing the rest of gorun.
package slurm
