// Command configcheck validates filter configurations without starting
// anything: each argument is a file holding the JSON that Envoy passes as
// the plugin configuration ("-" reads standard input). It prints the
// effective settings of a valid file and the error the filter would log for
// an invalid one, and exits 1 if any file is invalid.
//
//	go run ./filter/configcheck my-filter-config.json
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/edgelimit/edgelimit/filter/limiter"
)

const usage = `usage: configcheck FILE... (- for standard input)

Each FILE holds the JSON Envoy passes to the filter as its configuration
(envoy.yaml's configuration value). Prints the settings of a valid file and
the error the filter would log for an invalid one; exits 1 if any is
invalid, 2 on bad usage.`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run checks each named file; -h, -help or --help prints the usage.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			fmt.Fprintln(stdout, usage)
			return 0
		}
	}
	failed := false
	for _, name := range args {
		line, ok := check(name)
		fmt.Fprintln(stdout, line)
		failed = failed || !ok
	}
	if failed {
		return 1
	}
	return 0
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
