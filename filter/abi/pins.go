package abi

import "unsafe"

// pins holds the buffers the host allocated in the module's memory through
// proxy_on_memory_allocate. Between the allocation and the moment the Go side
// reads the host call's result, nothing in Go refers to the buffer but its
// address in a u32 the host wrote; the pin is the reference that keeps the
// garbage collector (which never moves objects) from reusing it meanwhile.
type pins struct {
	bufs [][]byte
}

// alloc returns a new pinned buffer of size bytes. A zero size still gets a
// real (one-byte) buffer, so that the address is never 0, which the ABI
// reads as an allocation failure.
func (p *pins) alloc(size uint32) []byte {
	b := make([]byte, max(size, 1))
	p.bufs = append(p.bufs, b)
	return b[:size]
}

// take unpins and returns the first n bytes of the buffer that starts at
// addr. It reports false when no pinned buffer starts there or n is larger
// than that buffer: the host then pointed outside what it was given.
func (p *pins) take(addr uintptr, n uint32) ([]byte, bool) {
	if addr == 0 && n == 0 {
		return nil, true
	}
	for i, b := range p.bufs {
		if uintptr(unsafe.Pointer(unsafe.SliceData(b))) != addr {
			continue
		}
		p.bufs[i] = p.bufs[len(p.bufs)-1]
		p.bufs[len(p.bufs)-1] = nil
		p.bufs = p.bufs[:len(p.bufs)-1]
		if uint64(n) > uint64(cap(b)) {
			return nil, false
		}
		return b[:n], true
	}
	return nil, false
}

// release unpins everything left, e.g. a buffer the host allocated for a call
// that then failed.
func (p *pins) release() {
	clear(p.bufs)
	p.bufs = p.bufs[:0]
}
