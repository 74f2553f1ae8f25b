package metrics

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"time"
)

// maxLine bounds one line of a metrics file; a record is about 250 bytes.
const maxLine = 1 << 20

// ReadFile reads the metrics file at path (the JSON lines Writer writes)
// and returns its records in file order. A null figure reads as NaN, and
// a last line without its newline that does not parse (torn by a killed
// writer) is left out. A missing file, an empty one, and a line that is
// not a record (not a JSON object with a numeric "step") are errors that
// name the file, the line and what to do.
func ReadFile(path string) ([]Record, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("metrics: read %s: no such file: the trainer writes it where [train] metrics (or gorun's --metrics) says, metrics.jsonl next to the train.toml by default", path)
	}
	if err != nil {
		return nil, fmt.Errorf("metrics: read: %w", err)
	}
	defer f.Close()
	recs, err := Read(f, path)
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("metrics: read %s: no records: the file is empty (the trainer writes one line per step once the first step ends)", path)
	}
	return recs, nil
}

// Read reads metrics records from r, as ReadFile does, naming the input
// name in errors. No input gives no records and no error.
func Read(r io.Reader, name string) ([]Record, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var recs []Record
	for line := 1; ; line++ {
		text, err := readLine(br)
		if errors.Is(err, errLongLine) {
			return nil, fmt.Errorf("metrics: read %s:%d: a line longer than %d bytes: not a metrics file", name, line, maxLine)
		}
		torn := errors.Is(err, io.EOF)
		if err != nil && !torn {
			return nil, fmt.Errorf("metrics: read %s:%d: %w", name, line, err)
		}
		if len(bytes.TrimSpace(text)) > 0 {
			rec, perr := parseRecord(text)
			switch {
			case perr == nil:
				recs = append(recs, rec)
			case !torn:
				return nil, fmt.Errorf("metrics: read %s:%d: %w; want one JSON object a line as the trainer writes, e.g. "+
					`{"step":12,"time":1712345678.123,"loss":3.41,...}`, name, line, perr)
			}
		}
		if torn {
			return recs, nil
		}
	}
}

var errLongLine = errors.New("line too long")

// readLine reads one line of at most maxLine bytes (errLongLine beyond),
// with its newline; at the end of the input it returns what is left and
// io.EOF.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, err
		}
		if len(line) > maxLine {
			return nil, errLongLine
		}
	}
}

// jsonRecord is a record line as JSON spells it: a null figure is nil.
type jsonRecord struct {
	Step       *float64 `json:"step"`
	Time       *float64 `json:"time"`
	Loss       *float64 `json:"loss"`
	LR         *float64 `json:"lr"`
	TokensPerS *float64 `json:"tokens_per_s"`
	MFU        *float64 `json:"mfu"`
	WorldSize  int      `json:"world_size"`
	Rank       int      `json:"rank"`
	Round      int      `json:"round"`
	ElapsedS   *float64 `json:"elapsed_s"`
	GradNorm   *float64 `json:"grad_norm"`
	ValLoss    *float64 `json:"val_loss"`
}

// parseRecord decodes one line of a metrics file.
func parseRecord(line []byte) (Record, error) {
	var j jsonRecord
	if err := json.Unmarshal(line, &j); err != nil {
		return Record{}, fmt.Errorf("not a JSON object: %w", err)
	}
	if j.Step == nil {
		return Record{}, errors.New(`no "step"`)
	}
	if *j.Step != math.Trunc(*j.Step) {
		return Record{}, fmt.Errorf(`"step" %v is not a whole number`, *j.Step)
	}
	orNaN := func(v *float64) float64 {
		if v == nil {
			return math.NaN()
		}
		return *v
	}
	r := Record{Step: int(*j.Step), Loss: orNaN(j.Loss), LR: orNaN(j.LR), TokensPerS: orNaN(j.TokensPerS), MFU: orNaN(j.MFU),
		WorldSize: j.WorldSize, Rank: j.Rank, Round: j.Round, ElapsedS: orNaN(j.ElapsedS), GradNorm: orNaN(j.GradNorm), ValLoss: orNaN(j.ValLoss)}
	if j.Time != nil {
		r.Time = time.UnixMilli(int64(math.Round(*j.Time * 1e3)))
	}
	return r, nil
}

// History is the line of steps the job's last state went through, out of
// recs in file order (as Read returns them, the records of every world the
// job ran in): each record stands until a later one of its step or an
// earlier step, which a world that went back to that step wrote, replaces
// it and every record after it. What History leaves out is what the job
// redid: len(recs) - len(History(recs)) steps, a step redone twice
// counting twice. recs is not changed.
func History(recs []Record) []Record {
	var out []Record
	for _, r := range recs {
		keep := len(out)
		for keep > 0 && out[keep-1].Step >= r.Step {
			keep--
		}
		out = append(out[:keep], r)
	}
	return out
}
