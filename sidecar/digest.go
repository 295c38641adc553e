package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/edgelimit/edgelimit/sidecar/keys"
)

const digestUsage = `Usage: sidecar digest [-key-salt SALT] [API-KEY...]

Prints, one per line, the digest of each API key as the plans file's clients
section takes it: sha256:<hex> (no salt) or hmac-sha256:<hex> (with the salt
of the sidecars that will read the file, -key-salt or SIDECAR_KEY_SALT). The
hex digits are those of the client's bucket key in Redis, rl:{<hex>}.
Without arguments the keys are read from standard input, one per line, which
keeps them off the process list.

Flags:
`

// runDigest is "sidecar digest": 0 when every key was printed, 1 on a bad
// key (named by its position, never quoted), 2 on bad flags.
func runDigest(args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sidecar digest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	salt := fs.String("key-salt", getenv(envName("key-salt")), "secret keying the digest (HMAC-SHA256), as the sidecars' -key-salt; env "+envName("key-salt"))
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), digestUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	d := keys.New([]byte(*salt))
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	n, bad := 0, 0
	one := func(key []byte, where string) {
		n++
		if err := keys.Check(key); err != nil {
			fmt.Fprintf(stderr, "sidecar digest: %s: %v\n", where, err)
			bad++
			return
		}
		fmt.Fprintln(w, d.Digest(key))
	}
	if fs.NArg() > 0 {
		for i, k := range fs.Args() {
			one([]byte(k), fmt.Sprintf("argument %d", i+1))
		}
	} else {
		sc := bufio.NewScanner(stdin)
		for line := 1; sc.Scan(); line++ {
			one(sc.Bytes(), fmt.Sprintf("line %d", line))
		}
		if err := sc.Err(); err != nil {
			fmt.Fprintf(stderr, "sidecar digest: standard input: %v\n", err)
			return 1
		}
	}
	if n == 0 {
		fmt.Fprintln(stderr, "sidecar digest: no API key given (arguments or one per line on standard input)")
		return 1
	}
	if bad > 0 {
		return 1
	}
	return 0
}
