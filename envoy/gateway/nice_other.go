//go:build !linux

package main

import (
	"fmt"
	"runtime"
)

// defaultNice: see nice_linux.go. Elsewhere the gateway keeps the priority
// it was started with.
const defaultNice = 10

// setNice leaves the default unapplied where the threads cannot be listed,
// and refuses a value given on the command line.
func setNice(n int, lowerOnly bool) error {
	if lowerOnly {
		return nil
	}
	return fmt.Errorf("not supported on %s", runtime.GOOS)
}
