package services

import (
	"github.com/edgelimit/edgelimit/e2e/services/bucket"
	"github.com/edgelimit/edgelimit/e2e/services/safety"
	"github.com/edgelimit/edgelimit/sidecar/plans"
)

// PlansFromFile reads the sidecar's plans file, so that the services and
// the edge limit every client by the same plan.
func PlansFromFile(path string) (safety.Plans, error) {
	p, err := plans.Load(path)
	if err != nil {
		return nil, err
	}
	return FromPlans(p), nil
}

// FromPlans adapts parsed plans: a client gets its own plan, else the
// default plan, else none.
func FromPlans(p *plans.Plans) safety.Plans {
	return func(client string) (bucket.Limit, bool) {
		plan, ok := p.Lookup([]byte(client))
		if !ok {
			return bucket.Limit{}, false
		}
		return bucket.Limit{Capacity: plan.Capacity, Rate: plan.Rate}, true
	}
}
