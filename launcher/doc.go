// Package launcher turns what the user asked for (flags, environment, the
// SLURM step) into a Launch — nodes, ranks, master, workers and their
// environment — and runs it with the elastic agent.
package launcher
