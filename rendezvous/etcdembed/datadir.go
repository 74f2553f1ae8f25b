package etcdembed

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// DataDirPrefix starts the name of every directory ClaimDataDir makes.
const DataDirPrefix = "gorun-etcd-"

// Inside a claimed directory: the lock its owner holds, and etcd's data.
const (
	dataDirLock = "lock"
	dataDirEtcd = "etcd"
)

// DataDir is a fresh data directory for one embedded member, private to
// the process that claimed it: no later member ever starts on its data.
// A job's member reusing a data dir left behind by an earlier run of the
// same job id (a SIGKILLed gorun, a requeue, a cluster whose job ids
// started again) brought back that run's raft log and its job secret, and
// the new cluster either took the old authentication or could not form.
//
// The directory holds a lock file, locked (flock) while its owner lives,
// and etcd's own directory (Path). The kernel drops the lock when the
// owner dies however it dies, so a later ClaimDataDir can tell a
// directory whose owner is gone from one in use and removes it.
type DataDir struct {
	root string
	lock *os.File
}

// ClaimDataDir makes a new directory scratch/gorun-etcd-<name>-<random>,
// locked by this process until Release, after removing every directory
// of that form under scratch (any name) whose owner is gone: the ones
// SIGKILLed members left. It creates scratch if needed. Directories of
// other forms, and ones whose owner lives, are never touched.
func ClaimDataDir(scratch, name string) (*DataDir, error) {
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return nil, fmt.Errorf("rendezvous: etcd data dir: %w", err)
	}
	// Sweeping is best effort: a directory that cannot be removed costs
	// disk space, not correctness, since no member reuses it.
	_ = sweepDataDirs(scratch)
	root, err := os.MkdirTemp(scratch, DataDirPrefix+name+"-")
	if err != nil {
		return nil, fmt.Errorf("rendezvous: etcd data dir: %w", err)
	}
	lock, err := lockDir(root)
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(root))
	}
	return &DataDir{root: root, lock: lock}, nil
}

// lockDir creates root's lock file locked. The file is locked under a
// temporary name and then renamed into place, so a sweeper that finds
// the lock file always finds it locked.
func lockDir(root string) (*os.File, error) {
	tmp := filepath.Join(root, dataDirLock+".new")
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: etcd data dir lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return nil, errors.Join(fmt.Errorf("rendezvous: lock etcd data dir %s: %w", root, err), f.Close())
	}
	if err := os.Rename(tmp, filepath.Join(root, dataDirLock)); err != nil {
		return nil, errors.Join(fmt.Errorf("rendezvous: etcd data dir lock: %w", err), f.Close())
	}
	return f, nil
}

// sweepDataDirs removes the claimed directories under scratch whose
// owner is gone, and returns the first error.
func sweepDataDirs(scratch string) error {
	entries, err := os.ReadDir(scratch)
	if err != nil {
		return err
	}
	var first error
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), DataDirPrefix) {
			continue
		}
		if err := removeIfAbandoned(filepath.Join(scratch, e.Name())); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// removeIfAbandoned removes root when it has a lock file that nobody
// holds. A directory without one (being created, or not ours) is kept.
func removeIfAbandoned(root string) error {
	f, err := os.OpenFile(filepath.Join(root, dataDirLock), os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil // its owner lives
		}
		return err
	}
	return os.RemoveAll(root)
}

// Path is the directory to give etcd (Config.DataDir).
func (d *DataDir) Path() string { return filepath.Join(d.root, dataDirEtcd) }

// Release removes the directory and everything in it, then drops the
// lock. It may run while etcd still writes there (a member that did not
// stop in time): the files go when etcd closes them. Safe to call more
// than once.
func (d *DataDir) Release() error {
	if d.lock == nil {
		return nil
	}
	err := os.RemoveAll(d.root)
	err = errors.Join(err, d.lock.Close())
	d.lock = nil
	if err != nil {
		return fmt.Errorf("rendezvous: remove etcd data dir: %w", err)
	}
	return nil
}
