// Package clientkey names the client of a request the way the filter does:
// the key in the x-api-key header, else the token of an
// `authorization: Bearer` header, taken by the filter's own ExtractKey
// (filter/limiter). A request the filter would refuse for a missing or
// invalid key has no client: "".
package clientkey

import (
	"net/http"

	"github.com/edgelimit/edgelimit/filter/limiter"
)

// FromRequest returns r's API key, or "" when it carries no usable one. Of
// a repeated header it reads the first value, as the proxy hands the filter
// the first.
func FromRequest(r *http.Request) string {
	return Of(r.Header.Get(limiter.KeyHeader), r.Header.Get(limiter.AuthorizationHeader))
}

// Of returns the API key of a request whose x-api-key and authorization
// headers (their first values) are apiKey and authorization, or "".
func Of(apiKey, authorization string) string {
	key, st := limiter.ExtractKey(apiKey, authorization)
	if st != limiter.KeyFound {
		return ""
	}
	return key
}
