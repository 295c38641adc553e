//go:build !linux

package main

import (
	"fmt"
	"runtime"
)

// setNice leaves the default (defaultNice, main.go) unapplied where the
// threads cannot be listed, and refuses a value given on the command line.
func setNice(n int, lowerOnly bool) error {
	if lowerOnly {
		return nil
	}
	return fmt.Errorf("not supported on %s", runtime.GOOS)
}
