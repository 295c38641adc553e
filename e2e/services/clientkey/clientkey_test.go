package clientkey

import (
	"net/http/httptest"
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
