// Package clientkey names the client of a request the way the filter does:
// the x-api-key header, else the token of an `authorization: Bearer` header.
package clientkey

import (
	"net/http"
	"strings"
)

// Header is where clients send their API key.
const Header = "x-api-key"

// FromRequest returns r's API key, or "" when it carries none.
func FromRequest(r *http.Request) string {
	if k := strings.TrimSpace(r.Header.Get(Header)); k != "" {
		return k
	}
	a := r.Header.Get("authorization")
	if len(a) > len("bearer ") && strings.EqualFold(a[:len("bearer ")], "bearer ") {
		return strings.TrimSpace(a[len("bearer "):])
	}
	return ""
}
