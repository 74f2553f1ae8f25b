// Package recovery plans how the ranks of a re-formed world get back the
// training state, and names that state: a Slice is the parameters and
// AdamW moments of elements [Lo, Hi) of the padded flat buffer after Step
// optimizer steps; a State is a Slice with the sample index a checkpoint
// records beside it.
//
// Who holds what. Each rank holds its owned slice at the last step it
// completed, or one step later, plus the copy it took before its last
// optimizer update (so every rank holds the step the slowest completed;
// see trainer/rollback.go). With [checkpoint] memory, package memcopy also
// keeps each rank's slice on the buddy rank of the next node (rank + local
// world size): these are extra offers. A worker restarted alone under gorun
// holds no live state, but its predecessor saved its slice after every step
// in the agent's snapshot directory (two slots: Saved and ParseSaved are
// the payload); it offers those as its own state, with no step completed
// (Done -1), so they neither cap nor count in the choice of the step.
//
// How the step is chosen. Every rank all-gathers an Announcement (its last
// completed step, its round, its new slice and its offers) and runs Decide
// on the same list: the newest step, no later than the last step every
// rank of the running world completed, whose offers cover the model, first
// from the ranks' own state and only then with the memory copies. A rank
// whose live state is from an older round (a stale rejoiner) neither caps
// the step nor lowers it. No step covered: Source None, and the caller
// resumes from a checkpoint or the seed.
//
// How it moves. Decide also deals out Pieces: each rank copies what it
// holds itself and takes the rest from the least-loaded holder; Pack and
// Unpack are the messages between two ranks, at most MaxMessageElems
// elements each (Messages), closed by a CRC-32C. The Trainer runs the
// collectives (trainer.Exchange); this package does no I/O.
package recovery
