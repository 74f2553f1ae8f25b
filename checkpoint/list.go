package checkpoint

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Entry is one directory of a checkpoint directory that List recognises.
type Entry struct {
	Name string
	Path string
	Step int64
	// Complete is true for a step-N directory with a manifest: a checkpoint (not yet verified).
	Complete bool
	// Temp is true for the temporary directory of a save that did not commit.
	Temp bool
}

// List returns the step directories of dir and the leftovers of saves that did not commit,
// ordered by step (temporary directories before the step directory of the same step). Other
// files are ignored. A missing dir is an empty list.
func List(dir string) ([]Entry, error) {
	des, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: list %s: %w", dir, err)
	}
	var out []Entry
	for _, de := range des {
		if !de.IsDir() {
			continue
		}
		name := de.Name()
		e := Entry{Name: name, Path: filepath.Join(dir, name)}
		if step, ok := ParseStep(name); ok {
			e.Step = step
			_, err := os.Stat(filepath.Join(e.Path, ManifestName))
			e.Complete = err == nil
		} else if rest, ok := cutAny(name, tmpPrefix, oldPrefix); ok {
			digits, _, _ := strings.Cut(rest, "-")
			step, ok := ParseStep(stepPrefix + digits)
			if !ok {
				continue
			}
			e.Step, e.Temp = step, true
		} else {
			continue
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if c := cmp.Compare(a.Step, b.Step); c != 0 {
			return c
		}
		if a.Temp != b.Temp {
			if a.Temp {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}

func cutAny(s string, prefixes ...string) (string, bool) {
	for _, p := range prefixes {
		if rest, ok := strings.CutPrefix(s, p); ok {
			return rest, true
		}
	}
	return "", false
}

// Resolve returns the step directory path names: path itself if it holds a manifest, otherwise
// the newest complete checkpoint in the checkpoint directory path (not verified).
// A path that does not exist is an error wrapping fs.ErrNotExist that says so.
func Resolve(path string) (string, error) {
	if _, err := os.Stat(filepath.Join(path, ManifestName)); err == nil {
		return path, nil
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return "", &notExistError{path: path}
	}
	entries, err := List(path)
	if err != nil {
		return "", err
	}
	for i := len(entries) - 1; i >= 0; i-- {
		if entries[i].Complete {
			return entries[i].Path, nil
		}
	}
	if _, ok := ParseStep(filepath.Base(path)); ok {
		return "", fmt.Errorf("checkpoint: %s has no %s: not a complete checkpoint", path, ManifestName)
	}
	return "", fmt.Errorf("%w in %s", ErrNoCheckpoint, path)
}

// notExistError is Resolve's error for a path that does not exist.
type notExistError struct{ path string }

func (e *notExistError) Error() string { return "checkpoint: " + e.path + " does not exist" }

func (e *notExistError) Unwrap() error { return fs.ErrNotExist }
