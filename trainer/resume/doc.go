// Package resume checkpoints the embedded trainer as distributed sharded checkpoints and resumes
// a run from the newest valid one, at any world size and parallel mode.
package resume
