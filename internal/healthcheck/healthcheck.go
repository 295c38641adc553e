// Package healthcheck is the HTTP probe the sidecar and the demo service
// run as their container health check (`sidecar healthcheck URL`,
// `demoservice healthcheck URL`): their images are distroless, with no
// shell and no HTTP client but the binary itself.
package healthcheck

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// DefaultTimeout bounds one probe: connecting, sending, and the answer's
// status line.
const DefaultTimeout = 2 * time.Second

// Check GETs rawURL (http only) and reports nil for a 2xx answer within
// timeout. Anything else is an error saying what came instead, with the
// start of the body (a sidecar's /readyz says why it is not ready).
// Redirects are not followed: a redirect is not a healthy answer.
func Check(rawURL string, timeout time.Duration) error {
	if err := checkURL(rawURL); err != nil {
		return err
	}
	client := &http.Client{
		Timeout:       timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Get(rawURL)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		return nil
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
	line, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
	if line != "" {
		return fmt.Errorf("GET %s: %s: %s", rawURL, resp.Status, line)
	}
	return fmt.Errorf("GET %s: %s", rawURL, resp.Status)
}

// checkURL refuses a URL Check cannot GET.
func checkURL(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return fmt.Errorf("URL %q: want http://HOST:PORT/PATH", rawURL)
	}
	return nil
}

// Main is the healthcheck command of the binary named name, with its
// arguments after "healthcheck": [-timeout D] URL. It returns the exit
// code: 0 healthy, 1 not, 2 bad usage.
func Main(name string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(name+" healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", DefaultTimeout, "give up after this long")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s healthcheck [-timeout D] URL\n\n"+
			"GETs URL (http://) and exits 0 if it answers 2xx within the timeout, 1 if not:\n"+
			"a container health check for an image with no shell or HTTP client.\n\nFlags:\n", name)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(stderr, "%s healthcheck: want one URL, got %d arguments\n", name, fs.NArg())
		return 2
	}
	if *timeout <= 0 {
		fmt.Fprintf(stderr, "%s healthcheck: -timeout: want a positive duration, got %v\n", name, *timeout)
		return 2
	}
	if err := checkURL(fs.Arg(0)); err != nil {
		fmt.Fprintf(stderr, "%s healthcheck: %v\n", name, err)
		return 2
	}
	if err := Check(fs.Arg(0), *timeout); err != nil {
		fmt.Fprintf(stderr, "%s healthcheck: %v\n", name, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s healthcheck: %s: ok\n", name, fs.Arg(0))
	return 0
}
