//go:build wasip1 && files

package main

import "os"

// readFile pulls in the file functions of package os, whose WASI imports
// (fd_filestat_get among them) older Envoy does not provide.
func readFile(path string) {
	_, err := os.ReadFile(path)
	logf("readfile=%v", err)
}
