//go:build wasip1 && !files

package main

func readFile(string) { logf("readfile=not built in") }
