package services

import (
	"errors"

	"github.com/edgelimit/edgelimit/e2e/services/shadow"
)

// Fleet is several services started together with one configuration, each
// on its own free loopback port.
type Fleet struct {
	Services []*Service
}

// StartFleet starts one service per name, all shaped by c (c.Name is
// replaced by each name). On error nothing is left running.
func StartFleet(names []string, c Config) (*Fleet, error) {
	f := &Fleet{}
	for _, name := range names {
		c.Name = name
		s, err := Start("127.0.0.1:0", c)
		if err != nil {
			f.Close()
			return nil, err
		}
		f.Services = append(f.Services, s)
	}
	return f, nil
}

// Clusters returns each service's address by name: the gateway's -cluster
// overrides.
func (f *Fleet) Clusters() map[string]string {
	m := make(map[string]string, len(f.Services))
	for _, s := range f.Services {
		m[s.Name] = s.Addr
	}
	return m
}

// Client returns client's counts summed over every replica of every service.
func (f *Fleet) Client(client string) ClientStats {
	var c ClientStats
	for _, s := range f.Services {
		c.add(s.Stats().Client(client))
	}
	return c
}

// Total returns every client's counts summed over the fleet.
func (f *Fleet) Total() ClientStats {
	var c ClientStats
	for _, s := range f.Services {
		c.add(s.Stats().Total())
	}
	return c
}

// Shadow returns the services' shadow comparisons merged.
func (f *Fleet) Shadow() shadow.Report {
	reps := make([]shadow.Report, len(f.Services))
	for i, s := range f.Services {
		reps[i] = s.Shadow()
	}
	return shadow.Merge(reps...)
}

// Close stops every service.
func (f *Fleet) Close() error {
	var errs []error
	for _, s := range f.Services {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}
