package limiter

// MaxKeyLen is the longest API key the filter accepts, in bytes.
const MaxKeyLen = 256

// KeyStatus says what ExtractKey found.
type KeyStatus uint8

// Outcomes of ExtractKey.
const (
	// KeyFound: a usable key.
	KeyFound KeyStatus = iota
	// KeyMissing: no key header, an empty one, and no Bearer credentials.
	KeyMissing
	// KeyInvalid: a key was given but is not 1 to MaxKeyLen visible ASCII
	// characters (control characters, spaces, non-ASCII, too long).
	KeyInvalid
)

// ValidKey reports whether k can be an API key: 1 to MaxKeyLen visible
// ASCII characters. Anything else could smuggle bytes into the callout's
// headers or the sidecar's logs.
func ValidKey(k string) bool {
	return len(k) > 0 && len(k) <= MaxKeyLen && isVisible(k)
}

// ExtractKey finds the client's API key from the value of the configured key
// header and of authorization (each "" when absent). The key header wins;
// otherwise "authorization: Bearer <key>" (scheme in any case, one or more
// spaces) is used. Other authorization schemes mean no key.
func ExtractKey(keyHeader, authorization string) (string, KeyStatus) {
	if keyHeader != "" {
		if !ValidKey(keyHeader) {
			return "", KeyInvalid
		}
		return keyHeader, KeyFound
	}
	const scheme = "bearer"
	a := authorization
	if len(a) <= len(scheme) || a[len(scheme)] != ' ' || !equalFoldASCII(a[:len(scheme)], scheme) {
		return "", KeyMissing
	}
	a = a[len(scheme):]
	for len(a) > 0 && a[0] == ' ' {
		a = a[1:]
	}
	if !ValidKey(a) {
		return "", KeyInvalid
	}
	return a, KeyFound
}

// equalFoldASCII compares s with lower-case ASCII lower, ignoring case.
func equalFoldASCII(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}
