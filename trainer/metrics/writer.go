package metrics

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorun/gorun/trainer/profile"
)

// RankPlaceholder in a metrics path is replaced by the rank, which gives
// every rank its own file; without it only rank 0 writes.
const RankPlaceholder = "{rank}"

// Record is the figures of one step: one JSON line such as
// {"step":12,"time":1712345678.123,"loss":3.41,"lr":0.0006,"tokens_per_s":5123.4,"mfu":0.31,"world_size":4,"rank":0,"round":2,"elapsed_s":31.5}.
// A NaN or infinite figure is written as null.
type Record struct {
	Step int // optimizer steps done, 1-based
	// Time is when the step ended, written as unix seconds with
	// millisecond precision; Write uses the time of the write when it is
	// zero.
	Time       time.Time
	Loss       float64 // mean training loss of the step
	LR         float64
	TokensPerS float64 // whole job, since the previous record
	// MFU is the model FLOPs utilisation over the same interval: the
	// model's FLOPs per second of one rank (model.Config.TrainFLOPsPerToken
	// times TokensPerS / WorldSize) over the fp32 FMA peak of that rank's
	// threads.
	MFU       float64
	WorldSize int
	Rank      int
	// Round is the round (TORCHELASTIC_RESTART_COUNT) of the world that
	// trained the step: a file holds the records of every world the job
	// ran in, and a step that a later world redid has a record of each
	// (see History).
	Round    int
	ElapsedS float64 // seconds since this process started training
	// GradNorm is the global gradient norm before clipping; 0 leaves it
	// out of the line.
	GradNorm float64
	// ValLoss is the loss on the held-out bytes; 0 or NaN leaves it out
	// of the line.
	ValLoss float64
	// Profile is where the step's time went; nil leaves it out of the
	// line. It is written as "profile":{"gemm_s":0.21,"attention_s":0.05,
	// ...,"waiting_s":0.01,"step_s":0.31}, one key per phase in seconds
	// and the step's wall time, which the phases add up to.
	Profile *profile.Step
	// Compute is the step's wall time minus this rank's wait in the
	// step's collectives (waits for slower peers included): a slow rank
	// computes longer, its peers wait longer. It is not written to the
	// line (the profile has the phases); the heartbeat carries it.
	Compute time.Duration
}

// appendJSON appends r as one JSON object and a newline.
func (r Record) appendJSON(b []byte) []byte {
	num := func(b []byte, name string, v float64) []byte {
		b = append(b, `,"`+name+`":`...)
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return append(b, "null"...)
		}
		return strconv.AppendFloat(b, v, 'g', -1, 64)
	}
	b = append(b, `{"step":`...)
	b = strconv.AppendInt(b, int64(r.Step), 10)
	b = append(b, `,"time":`...)
	b = strconv.AppendFloat(b, float64(r.Time.UnixMilli())/1e3, 'f', 3, 64)
	b = num(b, "loss", r.Loss)
	b = num(b, "lr", r.LR)
	b = num(b, "tokens_per_s", r.TokensPerS)
	b = num(b, "mfu", r.MFU)
	b = append(b, `,"world_size":`...)
	b = strconv.AppendInt(b, int64(r.WorldSize), 10)
	b = append(b, `,"rank":`...)
	b = strconv.AppendInt(b, int64(r.Rank), 10)
	b = append(b, `,"round":`...)
	b = strconv.AppendInt(b, int64(r.Round), 10)
	b = num(b, "elapsed_s", r.ElapsedS)
	if r.GradNorm != 0 {
		b = num(b, "grad_norm", r.GradNorm)
	}
	if !math.IsNaN(r.ValLoss) && r.ValLoss != 0 {
		b = num(b, "val_loss", r.ValLoss)
	}
	if r.Profile != nil {
		b = appendProfile(b, r.Profile)
	}
	return append(b, "}\n"...)
}

// appendProfile appends p as the "profile" object of a record.
func appendProfile(b []byte, p *profile.Step) []byte {
	b = append(b, `,"profile":{`...)
	for ph := range profile.NumPhases {
		if ph > 0 {
			b = append(b, ',')
		}
		b = append(b, `"`+ph.String()+`_s":`...)
		b = strconv.AppendFloat(b, p.Phases[ph].Seconds(), 'g', -1, 64)
	}
	b = append(b, `,"step_s":`...)
	b = strconv.AppendFloat(b, p.Total.Seconds(), 'g', -1, 64)
	return append(b, '}')
}

// Writer appends Records to a JSON-lines file, one whole line per write
// (nothing is buffered, so a killed worker leaves whole lines behind).
// It is safe for concurrent use.
type Writer struct {
	mu   sync.Mutex
	f    *os.File
	path string
	buf  []byte
	last int // the step of the file's last record, 0: none
}

// Path is the file rank writes for the metrics path pattern: the pattern
// with "{rank}" replaced by the rank, or "" when the rank writes none
// (pattern is "", or has no "{rank}" and rank is not 0).
func Path(pattern string, rank int) string {
	if pattern == "" || (!strings.Contains(pattern, RankPlaceholder) && rank != 0) {
		return ""
	}
	return strings.ReplaceAll(pattern, RankPlaceholder, strconv.Itoa(rank))
}

// Open returns the Writer of rank for the metrics path pattern (see
// Path). The file and its directory are created if needed; records are
// appended to what the file holds, never dropped: a run that goes back to
// an earlier step (a resume from a checkpoint, an in-place recovery that
// rolled back) writes the steps it redoes again, after the records of the
// world that first trained them, and History reads the job's final line
// of steps back. A last line without its newline (torn by a killed
// writer, never a whole record) is cut off first, so that every record
// starts a line. When the rank writes no file the Writer discards every
// record.
func Open(pattern string, rank int) (*Writer, error) {
	path := Path(pattern, rank)
	if path == "" {
		return &Writer{}, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("metrics: open: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("metrics: open: %w", err)
	}
	if err := cutTornLine(f); err != nil {
		return nil, errors.Join(fmt.Errorf("metrics: open %s: %w", path, err), f.Close())
	}
	last, err := lastStep(f)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("metrics: open %s: %w", path, err), f.Close())
	}
	return &Writer{f: f, path: path, last: last}, nil
}

// lastStep is the step of the last line of f, which ends with a newline
// (cutTornLine), or 0 when f is empty or its last line is not a record.
func lastStep(f *os.File) (int, error) {
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil || end == 0 {
		return 0, err
	}
	buf := make([]byte, min(end, 1<<16))
	if _, err := f.ReadAt(buf, end-int64(len(buf))); err != nil {
		return 0, err
	}
	line := buf[:len(buf)-1]
	line = line[bytes.LastIndexByte(line, '\n')+1:]
	var r struct {
		Step int `json:"step"`
	}
	if json.Unmarshal(line, &r) != nil {
		return 0, nil
	}
	return r.Step, nil
}

// LastStep is the step of the last record of the file: the one it held
// when opened, or the last one written since; 0 when it holds none, or
// when the rank writes no file.
func (w *Writer) LastStep() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// cutTornLine truncates f after its last newline (to empty without one).
func cutTornLine(f *os.File) error {
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	buf := make([]byte, 4096)
	for at := end; at > 0; {
		n := min(at, int64(len(buf)))
		at -= n
		if _, err := f.ReadAt(buf[:n], at); err != nil {
			return err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			if keep := at + int64(i) + 1; keep < end {
				return f.Truncate(keep)
			}
			return nil
		}
	}
	if end > 0 {
		return f.Truncate(0)
	}
	return nil
}

// Path is the file the Writer appends to, or "" when it discards.
func (w *Writer) Path() string { return w.path }

// Write appends r as one line. Writing after Close is an error.
func (w *Writer) Write(r Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.path == "" {
		return nil
	}
	if w.f == nil {
		return fmt.Errorf("metrics: write %s: closed", w.path)
	}
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	w.buf = r.appendJSON(w.buf[:0])
	if _, err := w.f.Write(w.buf); err != nil {
		return fmt.Errorf("metrics: write: %w", err)
	}
	w.last = r.Step
	return nil
}

// Close closes the file; a second Close does nothing.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	if err != nil {
		return fmt.Errorf("metrics: close: %w", err)
	}
	return nil
}
