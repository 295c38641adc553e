package limiter

import (
	"strings"
	"testing"
)

func TestExtractKey(t *testing.T) {
	for _, c := range []struct {
		keyHeader, auth string
		key             string
		status          KeyStatus
	}{
		{"abc", "", "abc", KeyFound},
		{"abc", "Bearer other", "abc", KeyFound},
		{"", "Bearer tok", "tok", KeyFound},
		{"", "bearer tok", "tok", KeyFound},
		{"", "BeArEr   tok", "tok", KeyFound},
		{"", "", "", KeyMissing},
		{"", "Basic dXNlcjpwYXNz", "", KeyMissing},
		{"", "Bearer", "", KeyMissing},
		{"", "Bearertok", "", KeyMissing},
		{"", "Bearer\ttok", "", KeyMissing},
		{"", "Bearer ", "", KeyInvalid},
		{"", "Bearer a b", "", KeyInvalid},
		{"", "Bearer tok\x00", "", KeyInvalid},
		{"a b", "", "", KeyInvalid},
		{"a\x7f", "", "", KeyInvalid},
		{"é", "", "", KeyInvalid},
		{"ctl\x1f", "", "", KeyInvalid},
		{"bad key", "Bearer good", "", KeyInvalid},
		{strings.Repeat("k", MaxKeyLen), "", strings.Repeat("k", MaxKeyLen), KeyFound},
		{strings.Repeat("k", MaxKeyLen+1), "", "", KeyInvalid},
		{"", "Bearer " + strings.Repeat("k", MaxKeyLen+1), "", KeyInvalid},
		{"!#$%&'*+-.^_`|~0aZ", "", "!#$%&'*+-.^_`|~0aZ", KeyFound},
	} {
		key, status := ExtractKey(c.keyHeader, c.auth)
		if key != c.key || status != c.status {
			t.Errorf("ExtractKey(%q, %q) = %q, %d; want %q, %d", c.keyHeader, c.auth, key, status, c.key, c.status)
		}
	}
}

// FuzzExtractKey: a key that comes out is always a valid key, taken from
// one of the two headers.
func FuzzExtractKey(f *testing.F) {
	f.Add("k", "")
	f.Add("", "Bearer tok")
	f.Add("", "bearer  \x00")
	f.Add("\xff", "Bearer x")
	f.Fuzz(func(t *testing.T, keyHeader, auth string) {
		key, status := ExtractKey(keyHeader, auth)
		switch status {
		case KeyFound:
			if !ValidKey(key) {
				t.Fatalf("found invalid key %q", key)
			}
			if key != keyHeader && !strings.HasSuffix(auth, key) {
				t.Fatalf("key %q from neither %q nor %q", key, keyHeader, auth)
			}
		case KeyMissing, KeyInvalid:
			if key != "" {
				t.Fatalf("status %d with key %q", status, key)
			}
			if status == KeyMissing && keyHeader != "" {
				t.Fatalf("key header %q reported missing", keyHeader)
			}
		default:
			t.Fatalf("status %d", status)
		}
	})
}
