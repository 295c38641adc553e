// Package wasmcost holds a few of the Go runtime's common operations, each
// as a function, so that BenchmarkGoInWasm can time the same Go inside
// wazero (exported by the module in ../testdata/wasmcost) and natively.
// filter/RATIONALE.md, "Why the stream tables are not maps", quotes it.
package wasmcost

type entry struct {
	a, b int
	p    *int
}

var (
	ints  = map[uint32]int{}
	ptrs  = map[uint32]*entry{}
	one   = &entry{}
	keep  *entry
	table [64]int
	sink  int
)

// Host is a call into the host that does nothing there. The module's main
// sets it to its import env.noop, which BenchmarkGoInWasm's host provides;
// natively it is this function.
var Host = func(x uint32) uint32 { return x + 1 }

// HostCalls calls the host ten times: what a host call costs, each way
// across the boundary.
func HostCalls(x uint32) uint32 {
	for range 10 {
		x = Host(x)
	}
	return x
}

// Empty does nothing: what entering an export costs.
func Empty(x uint32) uint32 { return x + 1 }

// MapInt inserts into a map of ints and deletes again.
func MapInt(x uint32) uint32 {
	ints[x] = 1
	delete(ints, x)
	return 0
}

// MapPtr inserts into a map of pointers and deletes again.
func MapPtr(x uint32) uint32 {
	ptrs[x] = one
	delete(ptrs, x)
	return 0
}

// MapGet looks a key up in a map of pointers.
func MapGet(x uint32) uint32 {
	if ptrs[x] != nil {
		return 1
	}
	return 0
}

// Alloc allocates a 32-byte object that escapes.
func Alloc(x uint32) uint32 {
	keep = &entry{a: int(x)}
	return 0
}

// Loop is 1000 iterations of a multiply-add over a small array.
func Loop(x uint32) uint32 {
	s := 0
	for i := 0; i < 1000; i++ {
		s += table[i&63] * (i + int(x))
	}
	sink = s
	return uint32(s)
}
