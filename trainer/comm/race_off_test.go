//go:build !race

package comm

// raceEnabled: this test binary runs under the race detector (see
// race_on_test.go).
const raceEnabled = false
