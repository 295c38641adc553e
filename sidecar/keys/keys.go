// Package keys turns a client's API key into the Redis key of its token
// bucket, and into a short identifier that is safe to log.
//
// Neither ever contains the raw API key: Redis, logs and metric labels see a
// SHA-256 digest only (an HMAC-SHA256 keyed by a secret salt when one is
// configured). See the repository's RATIONALE.md, "Why are bucket keys
// digests of the API key?".
package keys

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"sync"
)

// Prefix starts every bucket key. The digest after it is wrapped in a Redis
// Cluster hash tag ("{...}"), so any further key derived from the same client
// (for example a per-region shard "rl:{digest}:eu") can be placed on the
// same slot, or deliberately elsewhere by tagging it differently.
const Prefix = "rl:"

// BucketKeyLen is the length of every bucket key: the prefix, the braces and
// 64 hex digits of the 32-byte digest.
const BucketKeyLen = len(Prefix) + 2 + 2*sha256.Size

// LogIDLen is the length of a log identifier: the first 16 hex digits of the
// digest, enough to correlate log lines with one client and with its bucket
// key, too short to be worth inverting.
const LogIDLen = 16

// Digester computes bucket keys. The zero value is not usable; call New.
// A Digester is safe for concurrent use.
type Digester struct {
	salt  []byte
	hmacs sync.Pool // of hash.Hash, only when salt is set
}

// New returns a Digester. With an empty salt the digest is SHA-256 of the API
// key; with a salt it is HMAC-SHA256(salt, key), so someone who can read Redis
// cannot confirm a guessed key offline. Every sidecar sharing a Redis must use
// the same salt, or each would see its own buckets.
func New(salt []byte) *Digester {
	d := &Digester{salt: append([]byte(nil), salt...)}
	if len(d.salt) > 0 {
		d.hmacs.New = func() any { return hmac.New(sha256.New, d.salt) }
	}
	return d
}

// Sum returns the 32-byte digest of apiKey.
func (d *Digester) Sum(apiKey []byte) [sha256.Size]byte {
	if len(d.salt) == 0 {
		return sha256.Sum256(apiKey)
	}
	h := d.hmacs.Get().(hash.Hash)
	h.Reset()
	h.Write(apiKey)
	var out [sha256.Size]byte
	h.Sum(out[:0])
	d.hmacs.Put(h)
	return out
}

// Digest kinds: the prefix of a digest written for people (in the plans
// file, by "sidecar digest"), saying how it was computed.
const (
	KindSHA256     = "sha256"      // SHA-256 of the key: no salt
	KindHMACSHA256 = "hmac-sha256" // HMAC-SHA256 keyed by the salt
)

// Kind returns the kind of digest d computes.
func (d *Digester) Kind() string {
	if len(d.salt) == 0 {
		return KindSHA256
	}
	return KindHMACSHA256
}

// Digest returns apiKey's digest as "<kind>:<64 hex>", the same digits as
// in its bucket key.
func (d *Digester) Digest(apiKey []byte) string {
	sum := d.Sum(apiKey)
	return d.Kind() + ":" + hex.EncodeToString(sum[:])
}

// BucketKey returns the Redis key of apiKey's bucket: "rl:{" + 64 hex + "}".
func (d *Digester) BucketKey(apiKey []byte) string { return BucketKeyOf(d.Sum(apiKey)) }

// WarmBucket is a bucket no client has, the one of the all-zero digest:
// the sidecar's warm-ups peek at it (cost 0), which writes nothing.
var WarmBucket = BucketKeyOf([sha256.Size]byte{})

// BucketKeyOf returns the bucket key of a digest from Sum.
func BucketKeyOf(sum [sha256.Size]byte) string {
	var b [BucketKeyLen]byte
	n := copy(b[:], Prefix)
	b[n] = '{'
	hex.Encode(b[n+1:], sum[:])
	b[len(b)-1] = '}'
	return string(b[:])
}

// LogID returns the identifier to log for the client owning bucketKey: the
// first LogIDLen hex digits of its digest (the digits right after "rl:{"), so
// a log line can be matched to the bucket in Redis. It returns "" for a string
// that is not a bucket key.
func LogID(bucketKey string) string {
	start := len(Prefix) + 1
	if len(bucketKey) < start+LogIDLen {
		return ""
	}
	return bucketKey[start : start+LogIDLen]
}
