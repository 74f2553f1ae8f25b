package heartbeat

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Progress is what one heartbeat says: the step a worker finished and,
// when the worker knows them, that step's figures. A heartbeat is one
// line on the pipe: the step, then optional key=value fields,
//
//	12 loss=3.41 tokens_per_s=5123.4 mfu=0.31 compute_s=0.27
//
// A line of only the step (what any program, e.g. a PyTorch script, can
// write) is a heartbeat without figures; fields an agent does not know
// are ignored, so a newer worker may add some.
type Progress struct {
	Step       int
	Loss       float64 // NaN: not reported
	TokensPerS float64 // whole job, tokens per second; NaN: not reported
	MFU        float64 // model FLOPs utilisation, 0..1; NaN: not reported
	// ComputeS is the step's wall time minus this rank's wait in
	// collectives, in seconds: what a slow rank has more of than its
	// peers. NaN: not reported.
	ComputeS float64
	// Round is the round (TORCHELASTIC_RESTART_COUNT) the worker made the
	// step in: a worker kept in place across rounds reports its first step
	// in the new one by it. NaN: not reported.
	Round float64
	// Redone is the number of completed steps the job threw away in the
	// recovery that the worker went on from before this step (its
	// exchange's decision, the same on every rank; a resume from a
	// checkpoint counted from that checkpoint's step): reported with the
	// first step after a recovery. NaN: not reported.
	Redone float64
	// StateS is the seconds the worker spent restoring its training
	// state (from its peers or a checkpoint) before this step: reported
	// with the first step after a start or a recovery. NaN or 0: not
	// reported (a Progress made without it says nothing).
	StateS float64
}

// Unreported is a Progress of step with no figures.
func Unreported(step int) Progress {
	return Progress{Step: step, Loss: math.NaN(), TokensPerS: math.NaN(), MFU: math.NaN(), ComputeS: math.NaN(), Round: math.NaN(), Redone: math.NaN(), StateS: math.NaN()}
}

// progressFields names the optional fields of a heartbeat line.
var progressFields = []struct {
	key string
	val func(*Progress) *float64
}{
	{"loss", func(p *Progress) *float64 { return &p.Loss }},
	{"tokens_per_s", func(p *Progress) *float64 { return &p.TokensPerS }},
	{"mfu", func(p *Progress) *float64 { return &p.MFU }},
	{"compute_s", func(p *Progress) *float64 { return &p.ComputeS }},
	{"round", func(p *Progress) *float64 { return &p.Round }},
	{"redone", func(p *Progress) *float64 { return &p.Redone }},
	{"state_s", func(p *Progress) *float64 { return &p.StateS }},
}

// Line is p as one heartbeat line, newline included; figures that are
// NaN are left out, and a StateS of 0.
func (p Progress) Line() string {
	if p.StateS == 0 {
		p.StateS = math.NaN()
	}
	var b strings.Builder
	b.WriteString(strconv.Itoa(p.Step))
	for _, f := range progressFields {
		if v := *f.val(&p); !math.IsNaN(v) {
			b.WriteString(" " + f.key + "=" + strconv.FormatFloat(v, 'g', -1, 64))
		}
	}
	b.WriteByte('\n')
	return b.String()
}

// ParseLine reads one heartbeat line (without or with its newline). A
// line whose first field is not a step number is an error; a known field
// whose value is not a number is an error; unknown fields are ignored.
func ParseLine(line string) (Progress, error) {
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return Progress{}, fmt.Errorf("heartbeat: empty line")
	}
	step, err := strconv.Atoi(fields[0])
	if err != nil {
		return Progress{}, fmt.Errorf("heartbeat: line %q: step: %w", line, err)
	}
	p := Unreported(step)
	for _, kv := range fields[1:] {
		key, value, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		for _, f := range progressFields {
			if f.key != key {
				continue
			}
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return Progress{}, fmt.Errorf("heartbeat: line %q: %s: %w", line, key, err)
			}
			*f.val(&p) = v
		}
	}
	return p, nil
}
