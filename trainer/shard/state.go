package shard

// State is what a checkpoint of one rank holds: its slice of the
// parameters and of the AdamW moments, and where the run is. Every slice
// covers elements [Lo, Hi) of the padded flat buffer laid out by the
// model's Layout.
type State struct {
	Step   int64     // optimizer steps done
	Sample int64     // global index of the next sample to train on: the first of step Step
	Lo, Hi int       // the slice of the padded flat buffer that this rank owns
	Params []float32 // parameters [Lo, Hi)
	M, V   []float32 // AdamW first and second moments [Lo, Hi)
}
