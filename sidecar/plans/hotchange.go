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
	regions := func(h *Hot) []string {
		if h == nil {
			return nil
		}
		return h.Regions
	}
	byKey := func(p *Plans, k string) *Plan {
		if pl, ok := p.clients[k]; ok {
			return pl
		}
		return p.Default
	}
	byDigest := func(p *Plans, s [sha256.Size]byte) *Plan {
		if pl, ok := p.byDigest[s]; ok {
			return pl
		}
		return p.Default
	}
	seen := map[string]bool{}
	for _, m := range []map[string]*Hot{old.hot, new.hot} {
		for k := range m {
			if seen[k] {
				continue
			}
			seen[k] = true
			if from, to := regions(old.hot[k]), regions(new.hot[k]); !slices.Equal(from, to) {
				out = append(out, HotChange{Key: k, From: from, To: to, FromPlan: byKey(old, k), ToPlan: byKey(new, k)})
			}
		}
	}
	seenSum := map[[sha256.Size]byte]bool{}
	for _, m := range []map[[sha256.Size]byte]*Hot{old.hotDigest, new.hotDigest} {
		for s := range m {
			if seenSum[s] {
				continue
			}
			seenSum[s] = true
			if from, to := regions(old.hotDigest[s]), regions(new.hotDigest[s]); !slices.Equal(from, to) {
				out = append(out, HotChange{Sum: s, From: from, To: to, FromPlan: byDigest(old, s), ToPlan: byDigest(new, s)})
			}
		}
	}
	return out
}
