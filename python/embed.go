package pythonpkg

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// files is python/gorun's source, as built into the binary.
//
//go:embed gorun/*.py
var files embed.FS

// WarmComm is the command name (/proc/PID/comm, what ps shows) of a warm
// worker (gorun --warm-workers) while it waits for its round: gorun/_warm.py
// sets it, and takes its interpreter's name back when it becomes a round's
// worker. Tools that look for a job's workers by their environment leave
// it out (its RANK is a placeholder's).
const WarmComm = "gorun-warm"

// Package is the name of the Python package Extract writes: a directory
// of that name under the directory given.
const Package = "gorun"

// Extract writes the Python package into dir/gorun (dir is made, mode
// 0700, if missing; the files are 0600, readable by the job's user
// alone), so that a worker with dir on its PYTHONPATH imports it. A file
// already there is overwritten. It returns the first error, naming the
// file.
func Extract(dir string) error {
	dst := filepath.Join(dir, Package)
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return fmt.Errorf("python package: %w", err)
	}
	entries, err := fs.ReadDir(files, Package)
	if err != nil {
		return fmt.Errorf("python package: %w", err) // the embed pattern guarantees it: a bug
	}
	for _, e := range entries {
		data, err := files.ReadFile(Package + "/" + e.Name())
		if err != nil {
			return fmt.Errorf("python package: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), data, 0o600); err != nil {
			return fmt.Errorf("python package: %w", err)
		}
	}
	return nil
}
