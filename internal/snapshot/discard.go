package snapshot

import (
	"fmt"
	"os"
	"path/filepath"
)

// Discard makes incomplete every slot file in dir whose header is whole
// and whose step keep rejects, by zeroing the header (the payload then
// means nothing), and returns how many it discarded. The agent calls it
// once the steps to restore are agreed, with nothing writing to dir:
// a slot newer than the agreed step belongs to a timeline the job has
// abandoned, and left whole it would stay a rank's "newest" snapshot (the
// one pushed to peers, and the one a writer keeps while it overwrites the
// other slot) until training passes its step again. An unreadable
// directory or a failed write is an error naming the file.
func Discard(dir string, keep func(step uint64) bool) (int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("snapshot: discard: %w", err)
	}
	n := 0
	for _, e := range entries {
		if _, ok := slotRank(e.Name()); !ok || !e.Type().IsRegular() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		h, err := ReadHeader(path)
		if err != nil || keep(h.Step) {
			continue // no whole header: nothing to discard
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return n, fmt.Errorf("snapshot: discard: %w", err)
		}
		_, err = f.WriteAt(make([]byte, HeaderLen), 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return n, fmt.Errorf("snapshot: discard %s: %w", path, err)
		}
		n++
	}
	return n, nil
}
