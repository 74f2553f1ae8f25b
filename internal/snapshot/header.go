package snapshot

import "os"

// NewestHeader is the newest step of rank's slots in dir whose header is
// complete, and whether there is one. It reads the two headers alone, not
// the payloads (a figure for metrics and status, cheap at any size): a
// slot whose payload is corrupt counts; Verify is what restores trust.
func NewestHeader(dir string, rank int) (uint64, bool) {
	var newest uint64
	found := false
	for _, p := range Paths(dir, rank) {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		var raw [HeaderLen]byte
		_, err = f.ReadAt(raw[:], 0)
		f.Close()
		if err != nil {
			continue
		}
		if h, err := ParseHeader(raw[:]); err == nil && (!found || h.Step > newest) {
			newest, found = h.Step, true
		}
	}
	return newest, found
}
