package harness

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/gorun/gorun/trainer/metrics"
)

// Records is the job's final line of steps in the metrics file at path: its records as
// metrics.Read reads them (a last line still being written left out), then metrics.History
// (the records of steps a later world redid left out). A file not there yet, or empty, has
// none and no error, so a test may poll it while the job trains; a line that is not a record
// is an error naming the file and the line.
func Records(path string) ([]metrics.Record, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	defer f.Close()
	recs, err := metrics.Read(f, path)
	if err != nil {
		return nil, err
	}
	return metrics.History(recs), nil
}
