// Command configcheck validates filter configurations without starting
// anything: each argument is a file holding the JSON that Envoy passes as
// the plugin configuration ("-" reads standard input). It prints the
// effective settings of a valid file and the error the filter would log for
// an invalid one, and exits 1 if any file is invalid.
//
//	go run ./filter/configcheck envoy/filter-config.json
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/edgelimit/edgelimit/filter/limiter"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: configcheck FILE... (- for standard input)")
		os.Exit(2)
	}
	failed := false
	for _, name := range os.Args[1:] {
		line, ok := check(name)
		fmt.Println(line)
		failed = failed || !ok
	}
	if failed {
		os.Exit(1)
	}
}

// check reads and validates one configuration file.
func check(name string) (string, bool) {
	var data []byte
	var err error
	if name == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(name)
	}
	if err != nil {
		return fmt.Sprintf("%s: %v", name, err), false
	}
	cfg, err := limiter.Parse(data)
	if err != nil {
		return fmt.Sprintf("%s: invalid: %v", name, err), false
	}
	return fmt.Sprintf("%s: ok: %s", name, cfg.Summary()), true
}
