package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// ErrNoCheckpoint means a directory holds no complete checkpoint at all (a fresh start), as
// opposed to checkpoints that all failed to load.
var ErrNoCheckpoint = errors.New("checkpoint: no complete checkpoint")

// Request asks for the elements [Offset, Offset+len(Dst)) of the named flat tensor, to be
// written into Dst.
type Request struct {
	Name   string
	Offset int64
	Dst    []float32
}

// Skipped is a checkpoint the loader passed over, and why.
type Skipped struct {
	Name   string
	Step   int64
	Reason string
}

// Loaded is the outcome of a Load.
type Loaded struct {
	// Manifest of the checkpoint loaded: step, sample index, RNG state, layout, config hash.
	Manifest *Manifest
	// Dir is the step directory loaded.
	Dir string
	// Skipped lists the newer checkpoints that failed to load, newest first.
	Skipped []Skipped
	// BytesRead is the number of data bytes this rank read from the checkpoint loaded.
	BytesRead int64
}

// Summary says in one line what was loaded and what was skipped, e.g. "checkpoint
// step-00000200 is corrupt (shard-00001.bin tensor wte: crc32c mismatch ...), loading
// step-00000150".
func (l *Loaded) Summary() string {
	var b strings.Builder
	for _, s := range l.Skipped {
		fmt.Fprintf(&b, "checkpoint %s is corrupt (%s), ", s.Name, s.Reason)
	}
	fmt.Fprintf(&b, "loading %s", filepath.Base(l.Dir))
	return b.String()
}

// candidates is rank 0's list of complete checkpoints, newest first.
type candidates struct {
	Names []string `json:"names"`
	Err   string   `json:"err,omitempty"`
}

// attempt is one rank's result of loading one checkpoint.
type attempt struct {
	Err   string `json:"err,omitempty"`
	Fatal bool   `json:"fatal,omitempty"`
}

// Load fills every request from the newest complete checkpoint in dir that every rank can read
// and verify, and returns its manifest. c connects the ranks (nil: a single process); every rank
// calls Load with its own requests, which may follow any layout, and each reads only the checksum
// blocks overlapping them. The ranks agree on each candidate: if any rank finds it corrupt (a
// checksum mismatch, a missing or short file, a bad manifest) all of them skip to the previous
// checkpoint and record why in Loaded.Skipped. A request the checkpoint cannot answer (an unknown
// tensor, a range past its end: a *RequestError) fails the load without falling back. With no
// complete checkpoint in dir the error is ErrNoCheckpoint; when all fail, an error listing each.
// On error the Dst slices may be partly written. ctx bounds the collectives.
func Load(ctx context.Context, c Coordinator, dir string, want []Request) (*Loaded, error) {
	if c == nil {
		c = Solo()
	}
	var cands candidates
	if c.Rank() == 0 {
		entries, err := List(dir)
		if err != nil {
			cands.Err = err.Error()
		}
		for i := len(entries) - 1; i >= 0; i-- {
			if entries[i].Complete {
				cands.Names = append(cands.Names, entries[i].Name)
			}
		}
	}
	b, err := c.BroadcastBytes(ctx, mustJSON(cands))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: load %s: %w", dir, err)
	}
	if err := json.Unmarshal(b, &cands); err != nil {
		return nil, fmt.Errorf("checkpoint: load %s: bad message from rank 0: %w", dir, err)
	}
	if cands.Err != "" {
		return nil, fmt.Errorf("checkpoint: load %s: rank 0: %s", dir, cands.Err)
	}
	if len(cands.Names) == 0 {
		return nil, fmt.Errorf("%w in %s", ErrNoCheckpoint, dir)
	}
	out := &Loaded{}
	for _, name := range cands.Names {
		path := filepath.Join(dir, name)
		m, read, lerr := loadOne(path, want)
		var mine attempt
		if lerr != nil {
			var reqErr *RequestError
			mine = attempt{Err: lerr.Error(), Fatal: errors.As(lerr, &reqErr)}
		}
		v, err := agree(ctx, c, mine)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: load %s: %w", path, err)
		}
		if v.Fatal {
			if lerr != nil {
				return nil, fmt.Errorf("checkpoint: load %s: %w", path, lerr)
			}
			return nil, fmt.Errorf("checkpoint: load %s: %s", path, v.Err)
		}
		if v.Err == "" {
			out.Manifest, out.Dir, out.BytesRead = m, path, read
			return out, nil
		}
		step, _ := ParseStep(name)
		out.Skipped = append(out.Skipped, Skipped{Name: name, Step: step, Reason: v.Err})
	}
	reasons := make([]string, len(out.Skipped))
	for i, s := range out.Skipped {
		reasons[i] = s.Name + ": " + s.Reason
	}
	return out, fmt.Errorf("checkpoint: no loadable checkpoint in %s: %s", dir, strings.Join(reasons, "; "))
}

// agree gathers every rank's attempt at rank 0 and returns on every rank the first failure
// (fatal ones first), or an empty attempt if all succeeded.
func agree(ctx context.Context, c Coordinator, mine attempt) (attempt, error) {
	all, err := c.GatherBytes(ctx, mustJSON(mine))
	if err != nil {
		return attempt{}, err
	}
	var v attempt
	if c.Rank() == 0 {
		for r, b := range all {
			var a attempt
			if err := json.Unmarshal(b, &a); err != nil {
				a = attempt{Err: fmt.Sprintf("bad message: %v", err), Fatal: true}
			}
			if a.Err == "" || (v.Err != "" && (v.Fatal || !a.Fatal)) {
				continue
			}
			v = a
			if c.Size() > 1 {
				v.Err = fmt.Sprintf("rank %d: %s", r, a.Err)
			}
		}
	}
	b, err := c.BroadcastBytes(ctx, mustJSON(v))
	if err != nil {
		return attempt{}, err
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return attempt{}, fmt.Errorf("bad message from rank 0: %w", err)
	}
	return v, nil
}

// loadOne opens one checkpoint and answers every request from it.
func loadOne(path string, want []Request) (*Manifest, int64, error) {
	ck, err := Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer ck.Close()
	for _, r := range want {
		if err := ck.Read(r.Name, r.Offset, r.Dst); err != nil {
			return nil, ck.BytesRead(), err
		}
	}
	return ck.Manifest(), ck.BytesRead(), nil
}
