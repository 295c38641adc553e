//go:build race

package app

// raceEnabled is true under the race detector, which makes the sidecar's
// Go code several times slower.
const raceEnabled = true
