//go:build race

package estimate

// raceEnabled: the race detector changes what the heap holds.
const raceEnabled = true
