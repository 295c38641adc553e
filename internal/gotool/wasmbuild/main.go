// Command wasmbuild builds a wasip1 reactor the way the project ships
// filter.wasm (gotool.BuildWasm: go build, then wasm-opt), for the Makefile
// and the image:
//
//	go run ./internal/gotool/wasmbuild -o build/filter.wasm ./filter
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/edgelimit/edgelimit/internal/gotool"
)

func main() {
	out := flag.String("o", "", "the module to write (required)")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: wasmbuild -o out.wasm [go build flags] package")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	args := flag.Args()
	if err := gotool.BuildWasm(context.Background(), ".", args[len(args)-1], *out, args[:len(args)-1]...); err != nil {
		fmt.Fprintln(os.Stderr, "wasmbuild:", err)
		os.Exit(1)
	}
}
