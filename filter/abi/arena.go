package abi

import "unsafe"

// arenaSize is the module-owned buffer that host call results are written
// into. A callback's results are a header value or two, one header map and a
// few shared-data values, a few KiB at most; anything beyond spills to the
// Go heap (spill).
const arenaSize = 64 << 10

// maxTracked bounds how many allocations one host call may make and still
// have its result accepted. Envoy makes one per call (copyToPointerSize).
const maxTracked = 8

// arena hands out the memory the host writes results into
// (proxy_on_memory_allocate). Memory is bumped from a fixed buffer and
// reclaimed all at once by reset, which the binding does when a callback
// starts: everything a Host method returns is a view that stays valid until
// the callback returns. A request larger than what is left of the buffer (a
// large plugin configuration) gets its own Go slice, kept referenced in spill
// until the reset, so that the garbage collector, which cannot see the
// address the host holds, does not reuse it meanwhile.
//
// The allocations made during the host call in progress are tracked (begin
// starts a call), so that take accepts exactly what was handed out for it:
// a host that points anywhere else gets StatusInvalidMemoryAccess.
type arena struct {
	buf   [arenaSize]byte
	used  uintptr
	spill [][]byte
	// The allocations of the host call in progress.
	got [maxTracked][]byte
	n   int
}

func newArena() *arena { return new(arena) }

// alloc returns size bytes; a zero size still reserves one byte, so that
// its address is its own and not 0, which the ABI reads as a failure.
// Allocations are 8-byte aligned.
func (a *arena) alloc(size uint32) []byte {
	var b []byte
	if need := uintptr(max(size, 1)); uint64(need) <= uint64(arenaSize-a.used) {
		b = a.buf[a.used : a.used+need : a.used+need][:size]
		a.used = min((a.used+need+7)&^7, arenaSize)
	} else {
		b = a.spilled(size)
	}
	if a.n < maxTracked {
		a.got[a.n] = b
		a.n++
	}
	return b
}

func (a *arena) spilled(size uint32) []byte {
	s := make([]byte, max(size, 1))
	a.spill = append(a.spill, s)
	return s[:size]
}

// addrOf is the address of b's first byte, also when b is empty but has
// capacity behind it.
func addrOf(b []byte) uintptr {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b[:cap(b)])))
}

// begin starts a host call: take accepts only what is allocated from now on.
// The entries of earlier calls are left in got, unread past n: they point
// into buf, which lives as long as the module, or into spill, which reset
// clears them with. Clearing them here (a slice of pointers, so with the
// garbage collector's write barriers) cost more inside wasm than the rest
// of a host call's bookkeeping.
func (a *arena) begin() { a.n = 0 }

// take returns the n bytes at addr if they lie at the start of an allocation
// made since begin; (nil, true) for the empty result, address 0 and size 0.
func (a *arena) take(addr uintptr, n uint32) ([]byte, bool) {
	if addr == 0 && n == 0 {
		return nil, true
	}
	for i := 0; i < a.n; i++ {
		b := a.got[i]
		if addrOf(b) != addr || uint64(n) > uint64(len(b)) {
			continue
		}
		if n == 0 {
			return nil, true
		}
		return b[:n:n], true
	}
	return nil, false
}

// reset reclaims everything; views handed out before are invalid from now
// on.
func (a *arena) reset() {
	a.n, a.used = 0, 0
	if len(a.spill) > 0 {
		// got may still hold views of the spilled slices: drop them too,
		// so that the collector can have them.
		clear(a.got[:])
		clear(a.spill)
		a.spill = a.spill[:0]
	}
}
