package metrics

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// KeepBefore rewrites the metrics file at path to hold only the records of
// steps before from, in their order, for a run that goes on from step
// from. Every other line goes: the records of the steps the run redoes, a
// last line without its newline (torn by a killed writer), and lines that
// are not records (not a JSON object with a numeric "step"). A missing
// file, or one with nothing to drop, is left as it is. The kept lines are
// written to path+".tmp" in the same directory, synced and renamed over
// path, and the directory is synced: a crash leaves either the old file or
// the new one, never fewer records of the kept steps.
func KeepBefore(path string, from int) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("metrics: keep steps before %d: %w", from, err)
	}
	defer f.Close()
	dropped, err := filterLines(f, from, io.Discard)
	if err != nil || dropped == 0 {
		return wrapKeep(path, from, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return wrapKeep(path, from, err)
	}
	return wrapKeep(path, from, replace(path, func(w io.Writer) error {
		_, err := filterLines(f, from, w)
		return err
	}))
}

func wrapKeep(path string, from int, err error) error {
	if err != nil {
		return fmt.Errorf("metrics: keep the steps of %s before %d: %w", path, from, err)
	}
	return nil
}

// filterLines copies to w the lines of r that are whole records of steps
// before from and returns how many lines it left out.
func filterLines(r io.Reader, from int, w io.Writer) (dropped int, err error) {
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			if len(line) > 0 { // torn: no newline
				dropped++
			}
			return dropped, nil
		}
		if err != nil {
			return dropped, err
		}
		if step, ok := recordStep(line); !ok || step >= from {
			dropped++
			continue
		}
		if _, err := w.Write(line); err != nil {
			return dropped, err
		}
	}
}

// recordStep returns the step of a record line, and false for a line that
// is not a record.
func recordStep(line []byte) (int, bool) {
	var rec struct {
		Step *float64 `json:"step"`
	}
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &rec) != nil || rec.Step == nil {
		return 0, false
	}
	return int(*rec.Step), true
}

// replace writes path's new content with write into path+".tmp", syncs
// it, renames it over path and syncs the directory.
func replace(path string, write func(io.Writer) error) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	err = errors.Join(write(bw), bw.Flush(), f.Sync(), f.Close())
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return errors.Join(err, os.Remove(tmp))
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	return errors.Join(dir.Sync(), dir.Close())
}
