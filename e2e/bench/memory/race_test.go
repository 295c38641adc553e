//go:build race

package main

// raceEnabled is true under the race detector, which makes the host's side
// of every request (package wasmhost, in Go) several times slower.
const raceEnabled = true
