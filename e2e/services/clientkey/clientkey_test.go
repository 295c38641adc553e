package clientkey

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/filter/filtertest"
	"github.com/edgelimit/edgelimit/filter/filtertest/native"
	"github.com/edgelimit/edgelimit/filter/limiter"
)

// header is one request header as a client sends it.
type header struct{ name, value string }

// filterKey runs the filter (the limiter behind filtertest's emulation of
// Envoy's host calls) on a request with headers and returns the key it
// checks with the sidecar, "" when it checks none. When it checks one, the
// sidecar allows the request, and the headers the service then receives
// are returned too.
func filterKey(t *testing.T, headers []header) (key string, upstream []filtertest.Header) {
	t.Helper()
	h := native.NewHost(t)
	defer h.Close()
	if !h.Configure(`{}`) {
		t.Fatal("the filter refused its default configuration")
	}
	s := h.NewStream()
	defer s.Done()
	req := []filtertest.Header{{":method", "GET"}, {":path", "/orders/1"}, {":authority", "shop"}}
	for _, hd := range headers {
		req = append(req, filtertest.Header{strings.ToLower(hd.name), hd.value})
	}
	s.RequestHeaders(req)
	c, ok := s.Callout()
	if !ok {
		if r, replied := s.LocalReply(); !replied || r.Status != 401 {
			t.Fatalf("no check and no 401: reply %+v (%v), continued %v", r, replied, s.Continued())
		}
		return "", nil
	}
	key, _ = filtertest.Get(c.Headers, limiter.KeyHeader)
	s.RespondCallout(filtertest.SidecarAnswer("free", 10, 1, 10, 1), nil)
	if !s.Continued() {
		t.Fatalf("the filter held a request the sidecar allowed (key %q)", key)
	}
	return key, s.UpstreamHeaders()
}

// fromHeaders is FromRequest on a request carrying headers, repeated ones
// in order.
func fromHeaders(headers []header) string {
	r := httptest.NewRequest("GET", "/orders/1", nil)
	for _, h := range headers {
		r.Header.Add(h.name, h.value)
	}
	return FromRequest(r)
}

// compare checks that FromRequest names the client the filter checks, both
// on the client's request and on the request the service receives after
// the filter.
func compare(t *testing.T, headers []header) string {
	t.Helper()
	want, upstream := filterKey(t, headers)
	if got := fromHeaders(headers); got != want {
		t.Fatalf("headers %q: FromRequest = %q, the filter checks %q", headers, got, want)
	}
	if upstream != nil {
		var after []header
		for _, h := range upstream {
			if !strings.HasPrefix(h[0], ":") {
				after = append(after, header{h[0], h[1]})
			}
		}
		if got := fromHeaders(after); got != want {
			t.Fatalf("headers %q: behind the filter (%q) FromRequest = %q, the filter checked %q", headers, after, got, want)
		}
	}
	return want
}

func TestFromRequestAsTheFilter(t *testing.T) {
	tests := []struct {
		name    string
		headers []header
		want    string
	}{
		{"api key header", []header{{"x-api-key", "k1"}}, "k1"},
		{"header name in any case", []header{{"X-API-Key", "k1"}}, "k1"},
		{"bearer token", []header{{"authorization", "Bearer k2"}}, "k2"},
		{"bearer is case-insensitive", []header{{"authorization", "bEaReR k3"}}, "k3"},
		{"spaces after bearer", []header{{"authorization", "Bearer    k4"}}, "k4"},
		{"api key wins over bearer", []header{{"x-api-key", "k1"}, {"authorization", "Bearer k2"}}, "k1"},
		{"empty api key, then bearer", []header{{"x-api-key", ""}, {"authorization", "Bearer k2"}}, "k2"},
		{"an invalid api key does not fall back to bearer", []header{{"x-api-key", "a b"}, {"authorization", "Bearer k2"}}, ""},
		{"repeated api key: the first", []header{{"x-api-key", "first"}, {"x-api-key", "second"}}, "first"},
		{"space around the key is not trimmed", []header{{"x-api-key", " k1"}}, ""},
		{"tab after bearer", []header{{"authorization", "Bearer\tk5"}}, ""},
		{"trailing space in a bearer token", []header{{"authorization", "Bearer k5 "}}, ""},
		{"basic auth is not a key", []header{{"authorization", "Basic abc"}}, ""},
		{"bare bearer", []header{{"authorization", "Bearer "}}, ""},
		{"bearer without a space", []header{{"authorization", "Bearerk6"}}, ""},
		{"non-ASCII key", []header{{"x-api-key", "ключ"}}, ""},
		{"longest key", []header{{"x-api-key", strings.Repeat("k", limiter.MaxKeyLen)}}, strings.Repeat("k", limiter.MaxKeyLen)},
		{"over-long key", []header{{"x-api-key", strings.Repeat("k", limiter.MaxKeyLen+1)}}, ""},
		{"none", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := compare(t, tt.headers); got != tt.want {
				t.Fatalf("the filter and FromRequest name %q, want %q", got, tt.want)
			}
		})
	}
}

// FuzzFromRequestAsTheFilter: whatever the key headers hold, FromRequest
// names the client the filter checks.
func FuzzFromRequestAsTheFilter(f *testing.F) {
	f.Add(true, "k1", false, "")
	f.Add(false, "", true, "Bearer k2")
	f.Add(true, " ", true, "bearer  \t")
	f.Add(true, "", true, "bEaReR    k3")
	f.Add(false, "", true, "Basic x")
	f.Add(true, "a\x00b", true, "Bearer k4")
	f.Fuzz(func(t *testing.T, hasKey bool, key string, hasAuth bool, auth string) {
		var headers []header
		if hasKey {
			headers = append(headers, header{"x-api-key", key})
		}
		if hasAuth {
			headers = append(headers, header{"authorization", auth})
		}
		compare(t, headers)
	})
}
