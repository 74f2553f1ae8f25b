//go:build race

package comm

// raceEnabled: this test binary runs under the race detector, which makes
// the collectives' arithmetic 10-20 times slower and finds no more with
// larger inputs.
const raceEnabled = true
