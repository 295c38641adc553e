package region

import (
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{"", true},
		{"eu-west-1", true},
		{"us_east.2", true},
		{"AZaz09._-", true},
		{strings.Repeat("a", MaxLen), true},
		{strings.Repeat("a", MaxLen+1), false},
		{"eu west", false},
		{"eu/west", false},
		{"eu:west", false},
		{"région", false},
		{"eu\x00", false},
		{"eu\x7f", false},
	} {
		if got := Valid(tc.s); got != tc.want {
			t.Errorf("Valid(%q) = %t, want %t", tc.s, got, tc.want)
		}
		if got := Valid([]byte(tc.s)); got != tc.want {
			t.Errorf("Valid([]byte(%q)) = %t, want %t", tc.s, got, tc.want)
		}
	}
}
