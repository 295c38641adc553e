package keys

import (
	"errors"
	"fmt"
)

// MaxLen is the longest API key accepted, in bytes.
const MaxLen = 256

// Errors returned by Check. Their text is the short reason the sidecar sends
// back with a 400; none of them quotes the key.
var (
	ErrEmpty   = errors.New("empty api key")
	ErrTooLong = fmt.Errorf("api key longer than %d bytes", MaxLen)
	ErrControl = errors.New("api key contains a control character")
)

// Check reports whether apiKey is acceptable: 1 to MaxLen bytes, none of them
// an ASCII control character (0x00-0x1f, 0x7f). Keys are otherwise opaque and
// compared byte for byte: no trimming, case folding or Unicode
// normalisation, so two different keys can never share a bucket.
func Check(apiKey []byte) error {
	if len(apiKey) == 0 {
		return ErrEmpty
	}
	if len(apiKey) > MaxLen {
		return ErrTooLong
	}
	for _, c := range apiKey {
		if c < 0x20 || c == 0x7f {
			return ErrControl
		}
	}
	return nil
}
