package keys

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"sync"
	"testing"
)

func TestBucketKey(t *testing.T) {
	// Reference digests computed independently with the standard library.
	plain := sha256.Sum256([]byte("client-key-123"))
	mac := hmac.New(sha256.New, []byte("pepper"))
	mac.Write([]byte("client-key-123"))

	tests := []struct {
		name string
		salt string
		key  string
		want string
	}{
		{"no salt", "", "client-key-123", "rl:{" + hex.EncodeToString(plain[:]) + "}"},
		{"salt", "pepper", "client-key-123", "rl:{" + hex.EncodeToString(mac.Sum(nil)) + "}"},
		// Known-answer value of SHA-256("abc") from FIPS 180-2.
		{"fips abc", "", "abc", "rl:{ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := New([]byte(tt.salt)).BucketKey([]byte(tt.key))
			if got != tt.want {
				t.Fatalf("BucketKey(%q) = %q, want %q", tt.key, got, tt.want)
			}
			if len(got) != BucketKeyLen {
				t.Fatalf("len = %d, want %d", len(got), BucketKeyLen)
			}
			if strings.Contains(got, tt.key) {
				t.Fatalf("bucket key %q contains the raw key", got)
			}
			if id := LogID(got); id != got[4:4+LogIDLen] {
				t.Fatalf("LogID = %q, want the digits after the brace of %q", id, got)
			}
		})
	}
}

func TestSaltSeparatesBuckets(t *testing.T) {
	a := New(nil).BucketKey([]byte("k"))
	b := New([]byte("s1")).BucketKey([]byte("k"))
	c := New([]byte("s2")).BucketKey([]byte("k"))
	if a == b || b == c || a == c {
		t.Fatalf("salts do not separate keys: %q %q %q", a, b, c)
	}
}

func TestLogIDOfNonKey(t *testing.T) {
	for _, s := range []string{"", "rl:", "rl:{abc}"} {
		if got := LogID(s); got != "" {
			t.Errorf("LogID(%q) = %q, want empty", s, got)
		}
	}
}

// TestConcurrentSalted hammers the pooled HMACs: every goroutine must get the
// same digest for the same key, whatever state a pooled hash was left in.
func TestConcurrentSalted(t *testing.T) {
	d := New([]byte("salt"))
	want := map[string]string{}
	inputs := []string{"a", "bb", "client-key-123", strings.Repeat("x", 256)}
	for _, in := range inputs {
		want[in] = d.BucketKey([]byte(in))
	}
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				in := inputs[(g+i)%len(inputs)]
				if got := d.BucketKey([]byte(in)); got != want[in] {
					t.Errorf("BucketKey(%q) = %q, want %q", in, got, want[in])
					return
				}
			}
		}()
	}
	wg.Wait()
}

func BenchmarkBucketKey(b *testing.B) {
	for _, salt := range []string{"", "salt"} {
		d := New([]byte(salt))
		key := []byte("client-key-0000000123")
		b.Run("salt="+salt, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = d.BucketKey(key)
			}
		})
	}
}

func TestDigest(t *testing.T) {
	// Known-answer value of SHA-256("abc") from FIPS 180-2; the HMAC from
	// the standard library.
	mac := hmac.New(sha256.New, []byte("pepper"))
	mac.Write([]byte("abc"))
	if got, want := New(nil).Digest([]byte("abc")), "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"; got != want {
		t.Errorf("Digest(abc) = %s, want %s", got, want)
	}
	salted := New([]byte("pepper"))
	if got, want := salted.Digest([]byte("abc")), "hmac-sha256:"+hex.EncodeToString(mac.Sum(nil)); got != want {
		t.Errorf("salted Digest(abc) = %s, want %s", got, want)
	}
	// The digits are the bucket key's.
	for _, d := range []*Digester{New(nil), salted} {
		_, digits, _ := strings.Cut(d.Digest([]byte("k")), ":")
		if bk := d.BucketKey([]byte("k")); bk != "rl:{"+digits+"}" {
			t.Errorf("%s: bucket key %s, digest digits %s", d.Kind(), bk, digits)
		}
	}
}
