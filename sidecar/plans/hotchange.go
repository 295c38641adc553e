package plans

import (
	"crypto/sha256"
	"slices"
)

// HotChange is a client whose bucket is laid out differently by two plans
// files: hot in one and not in the other, or hot over other regions.
type HotChange struct {
	Key string            // the API key; "" for a client listed by digest
	Sum [sha256.Size]byte // the digest of a client listed by digest
	// From and To are the regions in the old and the new file (nil: one
	// bucket); FromPlan and ToPlan the client's plans there (nil: none,
	// its checks answered 403).
	From, To         []string
	FromPlan, ToPlan *Plan
}

// HotChanges returns the clients whose layout differs between old and new.
func HotChanges(old, new *Plans) []HotChange {
	var out []HotChange
	hotDiff(old.hot, new.hot, func(k string, from, to []string) {
		fromPlan, _, _ := old.LookupSum([]byte(k), [sha256.Size]byte{})
		toPlan, _, _ := new.LookupSum([]byte(k), [sha256.Size]byte{})
		out = append(out, HotChange{Key: k, From: from, To: to, FromPlan: fromPlan, ToPlan: toPlan})
	})
	hotDiff(old.hotDigest, new.hotDigest, func(s [sha256.Size]byte, from, to []string) {
		fromPlan, _, _ := old.LookupSum(nil, s)
		toPlan, _, _ := new.LookupSum(nil, s)
		out = append(out, HotChange{Sum: s, From: from, To: to, FromPlan: fromPlan, ToPlan: toPlan})
	})
	return out
}

// hotDiff calls changed with each client of old or new whose regions
// differ between the two (nil: not hot).
func hotDiff[K comparable](old, new map[K]*Hot, changed func(k K, from, to []string)) {
	regions := func(h *Hot) []string {
		if h == nil {
			return nil
		}
		return h.Regions
	}
	for k, h := range old {
		if from, to := regions(h), regions(new[k]); !slices.Equal(from, to) {
			changed(k, from, to)
		}
	}
	for k, h := range new {
		if _, both := old[k]; !both {
			changed(k, nil, regions(h))
		}
	}
}
