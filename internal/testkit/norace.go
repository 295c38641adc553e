//go:build !race

package testkit

// Race is true under the race detector (race.go).
const Race = false
