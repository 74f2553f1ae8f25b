package metrics

import (
	"fmt"
	"time"
)

// Progress is what one log line says about the run.
type Progress struct {
	Step       int           // optimizer steps done, 1-based
	Steps      int           // optimizer steps of the whole run
	Loss       float64       // mean training loss of the step, nats per byte
	LR         float64       // learning rate the step used
	TokensPerS float64       // tokens per second over the whole job since the last line
	MFU        float64       // model FLOPs utilisation since the last line (see Record.MFU)
	ETA        time.Duration // time left; see ETA
}

// String formats p as one line, e.g.
// "step 120/200 loss 2.41 lr 1.2e-03 tok/s 5123 mfu 0.31 eta 1m20s".
func (p Progress) String() string {
	return fmt.Sprintf("step %d/%d loss %.2f lr %.1e tok/s %.0f mfu %.2f eta %s",
		p.Step, p.Steps, p.Loss, p.LR, p.TokensPerS, p.MFU, p.ETA.Round(time.Second))
}

// ETA estimates the time left from the pace so far: elapsed for done
// steps, total - done to go. Pass the steps this process ran (not those a
// checkpoint restored) with the time they took. Zero when done is not
// positive or the run is over.
func ETA(elapsed time.Duration, done, toGo int) time.Duration {
	if done <= 0 || toGo <= 0 {
		return 0
	}
	return time.Duration(float64(elapsed) / float64(done) * float64(toGo))
}

// ShouldLog reports whether step (1-based) of a run of steps gets a log
// line with one every logEvery steps: the first step, every multiple of
// logEvery and the last step do.
func ShouldLog(step, logEvery, steps int) bool {
	return step == 1 || step == steps || (logEvery > 0 && step%logEvery == 0)
}
