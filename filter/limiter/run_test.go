package limiter_test

import (
	"testing"

	"github.com/edgelimit/edgelimit/filter/filtertest"
)

// TestBehaviour runs the filter's whole behaviour table against the logic
// behind the emulated host; e2e runs the same table against filter.wasm.
func TestBehaviour(t *testing.T) {
	filtertest.Run(t, filtertest.NewNative)
}
