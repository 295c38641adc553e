// Package prefault makes the Go heap's pages resident before a server takes
// traffic.
//
// Until its next collection a heap grows into pages the process has not
// touched yet, or that the scavenger gave back, and each costs a page fault
// when it is first written: 11 µs or more on the 2-core VM this project is
// measured on. A server that starts with a large GOGC and allocates per
// request pays for tens of megabytes of them, page by page, in its first
// seconds of traffic. Heap pays them once, at start, where nothing waits
// (the JVM's AlwaysPreTouch, for Go's heap). The root RATIONALE.md, "Why
// does the stand-in fault its heap in at start?", has the measurements.
package prefault

import (
	"os"
	"runtime"
	"runtime/metrics"
)

// Heap writes one byte in each page between the heap's resident size and
// its goal, in allocations of one chunk each that it then drops and
// collects. The page allocator hands the pages out again as the heap grows,
// already resident, and the scavenger keeps them, since they lie within the
// goal. It returns the number of bytes it made resident (0 when the heap
// already reaches its goal). It collects twice, so call it where nothing
// waits on the collections: at start, before serving, or after a reload
// has built what will serve, before it takes requests.
func Heap() int {
	runtime.GC()
	n := shortfall()
	if n <= 0 {
		return 0
	}
	// In chunks, not one allocation: the page allocator takes the lowest
	// free addresses first, which are the holes a start-up collection
	// left and the scavenger returned, exactly where the heap's next
	// spans would come from; one allocation of n would need n contiguous.
	page := os.Getpagesize()
	chunks := make([][]byte, 0, n/chunk+1)
	for left := n; left > 0; left -= chunk {
		b := make([]byte, min(left, chunk))
		for i := 0; i < len(b); i += page {
			b[i] = 1
		}
		chunks = append(chunks, b)
	}
	runtime.KeepAlive(chunks)
	chunks = nil
	runtime.GC()
	return n
}

// chunk is the size of each allocation Heap makes: above the largest size
// class, so that each is a span of its own straight from the page allocator.
const chunk = 64 << 10

// shortfall is how many bytes the heap may still grow by, before its next
// collection, into pages that are not resident: the goal less what the heap
// holds resident now (objects, spans' unused room, free pages not returned
// to the system).
func shortfall() int {
	s := []metrics.Sample{
		{Name: "/gc/heap/goal:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
	}
	metrics.Read(s)
	for _, x := range s {
		if x.Value.Kind() != metrics.KindUint64 {
			return 0
		}
	}
	goal := s[0].Value.Uint64()
	held := s[1].Value.Uint64() + s[2].Value.Uint64() + s[3].Value.Uint64()
	if goal <= held {
		return 0
	}
	return int(goal - held)
}
