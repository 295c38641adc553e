package server

import (
	"errors"
	"fmt"

	"github.com/valyala/fasthttp"

	"github.com/edgelimit/edgelimit/internal/region"
	"github.com/edgelimit/edgelimit/sidecar/keys"
	"github.com/edgelimit/edgelimit/sidecar/plans"
)

// Request headers of POST /v1/check.
const (
	HeaderKey    = "x-api-key"
	HeaderCost   = "x-ratelimit-cost"
	HeaderRegion = "x-ratelimit-region"
	HeaderSent   = "x-ratelimit-sent"
)

// MaxCost is the largest x-ratelimit-cost accepted: the largest capacity a
// plan may have, so every accepted cost fits some plan.
const MaxCost = plans.MaxCapacity

// Check is one parsed /v1/check request.
type Check struct {
	Key    []byte // the API key, valid per keys.Check; aliases the request
	Cost   int64  // 1 to MaxCost; 1 when the header is absent
	Region []byte // optional, may be empty; aliases the request
	// Sent is the proxy's clock when it sent the check, µs since the
	// epoch; 0 when the header is absent (a caller other than the filter).
	Sent int64
}

// Reasons a check is malformed. The text is the 400 response body.
var (
	ErrNoKey        = errors.New("missing x-api-key header")
	ErrManyKeys     = errors.New("more than one x-api-key header")
	ErrManyCosts    = errors.New("more than one x-ratelimit-cost header")
	ErrCostSyntax   = errors.New("x-ratelimit-cost must be a positive whole number")
	ErrCostZero     = errors.New("x-ratelimit-cost must be at least 1")
	ErrCostTooLarge = fmt.Errorf("x-ratelimit-cost must be at most %d", MaxCost)
	ErrManySents    = errors.New("more than one x-ratelimit-sent header")
	ErrSentSyntax   = errors.New("x-ratelimit-sent must be the proxy's clock in whole microseconds since 1970, at most 17 digits")
	ErrRegion       = errors.New("x-ratelimit-region must be " + region.Rule)
	ErrManyRegions  = errors.New("more than one x-ratelimit-region header")
)

// ParseCheck reads and validates the check headers. A header sent twice is
// an error rather than "first one wins": the filter and the sidecar must not
// be able to read different keys, costs or regions from the same request.
func ParseCheck(h *fasthttp.RequestHeader) (Check, error) {
	var c Check
	switch vals := h.PeekAll(HeaderKey); len(vals) {
	case 0:
		return c, ErrNoKey
	case 1:
		c.Key = vals[0]
	default:
		return c, ErrManyKeys
	}
	if err := keys.Check(c.Key); err != nil {
		return c, err
	}
	switch vals := h.PeekAll(HeaderCost); len(vals) {
	case 0:
		c.Cost = 1
	case 1:
		cost, err := ParseCost(vals[0])
		if err != nil {
			return c, err
		}
		c.Cost = cost
	default:
		return c, ErrManyCosts
	}
	// The region picks a hot client's bucket: one, or the check is unclear.
	switch vals := h.PeekAll(HeaderRegion); len(vals) {
	case 0:
	case 1:
		c.Region = vals[0]
	default:
		return c, ErrManyRegions
	}
	if !region.Valid(c.Region) {
		return c, ErrRegion
	}
	var err error
	c.Sent, err = ParseSent(h)
	return c, err
}

// maxSentDigits is the most digits x-ratelimit-sent may have.
const maxSentDigits = 17

// ParseSent reads x-ratelimit-sent, which checks and warm-up calls carry:
// 1 to 17 ASCII digits (µs since 1970 until the year 5138), or 0 when
// absent.
func ParseSent(h *fasthttp.RequestHeader) (int64, error) {
	switch vals := h.PeekAll(HeaderSent); len(vals) {
	case 0:
		return 0, nil
	case 1:
		if len(vals[0]) > maxSentDigits {
			return 0, ErrSentSyntax // leading zeros included
		}
		n, err := parseDigits(vals[0], 99_999_999_999_999_999)
		if err != nil {
			return 0, ErrSentSyntax
		}
		return n, nil
	default:
		return 0, ErrManySents
	}
}

// ParseCost parses a cost: ASCII digits only (no sign, space, exponent or
// fraction), value 1 to MaxCost. An empty value is a syntax error, not the
// default: a sender that sets the header means to say something.
func ParseCost(b []byte) (int64, error) {
	n, err := parseDigits(b, MaxCost)
	switch {
	case err == errNotDigits:
		return 0, ErrCostSyntax
	case err != nil:
		return 0, ErrCostTooLarge
	case n == 0:
		return 0, ErrCostZero
	}
	return n, nil
}

var (
	errNotDigits = errors.New("not ASCII digits")
	errTooLarge  = errors.New("too large")
)

// parseDigits parses b, ASCII digits only and at least one, as a number of
// at most max (below 2^63/10, so that no step overflows).
func parseDigits(b []byte, max int64) (int64, error) {
	if len(b) == 0 {
		return 0, errNotDigits
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, errNotDigits
		}
		n = n*10 + int64(c-'0')
		if n > max {
			return 0, errTooLarge
		}
	}
	return n, nil
}
