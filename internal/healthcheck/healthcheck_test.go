package healthcheck

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

func TestHealthcheck(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			w.Write([]byte("ok\n"))
		case "/notready":
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("redis: connection refused\nmore\n"))
		case "/moved":
			http.Redirect(w, r, "/readyz", http.StatusFound)
		case "/hang":
			<-r.Context().Done() // until the client gives up
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	closed := "http://" + testkit.RefusedAddr(t) + "/readyz"

	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"ready", []string{srv.URL + "/readyz"}, 0, "demo healthcheck: " + srv.URL + "/readyz: ok\n", ""},
		{"not ready", []string{srv.URL + "/notready"}, 1, "", "demo healthcheck: GET " + srv.URL + "/notready: 503 Service Unavailable: redis: connection refused\n"},
		{"not found", []string{srv.URL + "/x"}, 1, "", "404 Not Found: 404 page not found"},
		{"redirect not followed", []string{srv.URL + "/moved"}, 1, "", "302 Found"},
		{"no answer in time", []string{"-timeout", "50ms", srv.URL + "/hang"}, 1, "", "Client.Timeout exceeded"},
		{"nothing listening", []string{closed}, 1, "", "connection refused"},
		{"not http", []string{"https://127.0.0.1:1/readyz"}, 2, "", `URL "https://127.0.0.1:1/readyz": want http://HOST:PORT/PATH`},
		{"not a URL", []string{"notaurl"}, 2, "", `URL "notaurl": want http://HOST:PORT/PATH`},
		{"no URL", nil, 2, "", "demo healthcheck: want one URL, got 0 arguments"},
		{"two URLs", []string{srv.URL, srv.URL}, 2, "", "want one URL, got 2 arguments"},
		{"bad timeout", []string{"-timeout", "0s", srv.URL}, 2, "", "-timeout: want a positive duration, got 0s"},
		{"help", []string{"-h"}, 0, "", "Usage: demo healthcheck [-timeout D] URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := Main("demo", tc.args, &out, &errOut); code != tc.code {
				t.Errorf("exit %d, want %d; stderr %q", code, tc.code, errOut.String())
			}
			if out.String() != tc.stdout {
				t.Errorf("stdout %q, want %q", out.String(), tc.stdout)
			}
			if !strings.Contains(errOut.String(), tc.stderr) || (tc.stderr == "") != (errOut.Len() == 0) {
				t.Errorf("stderr %q, want %q", errOut.String(), tc.stderr)
			}
		})
	}
}
