//go:build wasip1 && !soakgc

package main

import (
	"github.com/edgelimit/edgelimit/filter/abi"
	"github.com/edgelimit/edgelimit/filter/limiter"
)

// plugin is what receives the callbacks: the limiter itself, except in the
// garbage-collection soak's build (soakgc.go).
func plugin(l *limiter.Limiter) abi.Plugin { return l }
