package services

import (
	"github.com/edgelimit/edgelimit/e2e/services/bucket"
	"github.com/edgelimit/edgelimit/e2e/services/safety"
	"github.com/edgelimit/edgelimit/sidecar/keys"
	"github.com/edgelimit/edgelimit/sidecar/plans"
)

// PlansFromFile reads the sidecar's plans file, so that the services and
// the edge limit every client by the same plan. salt is the sidecar's
// -key-salt (empty for none): a file whose clients are listed by
// hmac-sha256: digests is matched only with it, and a file whose digests
// do not fit the salt is refused, as the sidecar refuses it.
func PlansFromFile(path string, salt []byte) (safety.Plans, error) {
	p, err := plans.Load(path)
	if err != nil {
		return nil, err
	}
	d := keys.New(salt)
	if err := p.CheckDigests(d.Kind()); err != nil {
		return nil, err
	}
	return FromPlans(p, d), nil
}

// FromPlans adapts parsed plans: a client gets its own plan, else the
// default plan, else none; clients listed by digest are matched by d's
// digest of the key, as the sidecar matches them.
func FromPlans(p *plans.Plans, d *keys.Digester) safety.Plans {
	return func(client string) (bucket.Limit, bool) {
		key := []byte(client)
		plan, _, ok := p.LookupSum(key, d.Sum(key))
		if !ok {
			return bucket.Limit{}, false
		}
		return bucket.Limit{Capacity: plan.Capacity, Rate: plan.Rate}, true
	}
}
