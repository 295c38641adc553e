package clientkey

import (
	"net/http/httptest"
	"strings"
	"testing"
)

func TestFromRequest(t *testing.T) {
	tests := []struct {
		name    string
		headers map[string]string
		want    string
	}{
		{"api key header", map[string]string{"x-api-key": "k1"}, "k1"},
		{"bearer token", map[string]string{"authorization": "Bearer k2"}, "k2"},
		{"bearer is case-insensitive", map[string]string{"authorization": "bEaReR k3"}, "k3"},
		{"api key wins over bearer", map[string]string{"x-api-key": "k1", "authorization": "Bearer k2"}, "k1"},
		{"basic auth is not a key", map[string]string{"authorization": "Basic abc"}, ""},
		{"bare bearer", map[string]string{"authorization": "Bearer "}, ""},
		{"none", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			for k, v := range tt.headers {
				r.Header.Set(k, v)
			}
			if got := FromRequest(r); got != tt.want {
				t.Fatalf("FromRequest = %q, want %q", got, tt.want)
			}
		})
	}
}

// FuzzFromRequest: whatever the headers hold, the key is trimmed and comes
// from one of them.
func FuzzFromRequest(f *testing.F) {
	f.Add("k1", "")
	f.Add("", "Bearer k2")
	f.Add(" ", "bearer  \t")
	f.Add("", "Basic x")
	f.Fuzz(func(t *testing.T, apiKey, auth string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header["X-Api-Key"] = []string{apiKey}
		r.Header["Authorization"] = []string{auth}
		got := FromRequest(r)
		if got != strings.TrimSpace(got) {
			t.Fatalf("key %q not trimmed", got)
		}
		if got != "" && !strings.Contains(apiKey, got) && !strings.Contains(auth, got) {
			t.Fatalf("key %q from neither %q nor %q", got, apiKey, auth)
		}
	})
}
