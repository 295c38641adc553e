package keys

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		key  string
		want error
	}{
		{"client-key-123", nil},
		{"a", nil},
		{strings.Repeat("k", MaxLen), nil},
		{"with space inside", nil},
		{"ünïcødé", nil},
		{"", ErrEmpty},
		{strings.Repeat("k", MaxLen+1), ErrTooLong},
		{"a\x00b", ErrControl},
		{"a\r\nx-injected: 1", ErrControl},
		{"tab\t", ErrControl},
		{"del\x7f", ErrControl},
	}
	for _, tt := range tests {
		if got := Check([]byte(tt.key)); got != tt.want {
			t.Errorf("Check(%q) = %v, want %v", tt.key, got, tt.want)
		}
	}
}
