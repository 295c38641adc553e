//go:build !race

package app

// raceEnabled is true under the race detector.
const raceEnabled = false
