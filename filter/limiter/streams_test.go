package limiter

import (
	"math/rand/v2"
	"testing"
)

// TestStreamTableAgainstMap drives the table and a Go map with the same
// random operations and compares every answer. Keys come from a few
// small ranges, so runs collide, wrap around the end of the table and are
// shifted back on removal; the table grows several times on the way.
func TestStreamTableAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tab streamTable
	model := map[uint32]*stream{}
	key := func() uint32 {
		switch rng.IntN(3) {
		case 0:
			return rng.Uint32N(300) // consecutive ids, as the proxy hands out
		case 1:
			return 0xffffff00 + rng.Uint32N(256) // near the top of the range
		default:
			return rng.Uint32N(64) * 64 // every one on the same few homes
		}
	}
	for op := range 200000 {
		k := key()
		switch rng.IntN(3) {
		case 0:
			s := &stream{id: k}
			tab.put(k, s)
			model[k] = s
		case 1:
			if got, want := tab.remove(k), model[k]; got != want {
				t.Fatalf("op %d: remove(%d) = %p, want %p", op, k, got, want)
			}
			delete(model, k)
		default:
			if got, want := tab.get(k), model[k]; got != want {
				t.Fatalf("op %d: get(%d) = %p, want %p", op, k, got, want)
			}
		}
		if tab.n != len(model) {
			t.Fatalf("op %d: %d entries, want %d", op, tab.n, len(model))
		}
	}
	for k, s := range model {
		if tab.get(k) != s {
			t.Fatalf("get(%d) lost its stream", k)
		}
	}
}

func TestStreamTableEmpty(t *testing.T) {
	var tab streamTable
	if tab.get(7) != nil || tab.remove(7) != nil {
		t.Fatal("an empty table returned a stream")
	}
	s := &stream{}
	tab.put(0, s) // 0 is a key like any other
	if tab.get(0) != s || tab.remove(0) != s || tab.get(0) != nil || tab.n != 0 {
		t.Fatal("key 0 was not stored and removed")
	}
}
