package wasmhost

import "unsafe"

// textArena copies what a host call keeps of the module's memory (a header
// it adds, a callout's headers and cluster) into strings that share blocks
// of a few KiB, where a string conversion is an allocation of its own,
// several a request. A block is written once, front to back, and never
// reused: a string made from it stays as it was for as long as anything
// holds it, and the collector keeps the block alive for it. Only the task
// running in the VM uses a VM's arena, as with the rest of its state.
type textArena struct{ block []byte }

const (
	arenaBlock = 4096
	// arenaLarge is the largest copy taken from a block; a larger one is
	// an allocation of its own, so that it does not leave most of a block
	// unused.
	arenaLarge = arenaBlock / 4
)

// room returns n bytes to fill, from the current block if they fit.
func (a *textArena) room(n int) []byte {
	if n > arenaLarge {
		return make([]byte, n)
	}
	if len(a.block)+n > cap(a.block) {
		a.block = make([]byte, 0, arenaBlock)
	}
	b := a.block[len(a.block) : len(a.block)+n]
	a.block = a.block[:len(a.block)+n]
	return b
}

// bytes returns a copy of b.
func (a *textArena) bytes(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	r := a.room(len(b))
	copy(r, b)
	return unsafe.String(&r[0], len(r))
}

// pair returns copies of name, lower-cased as Envoy's LowerCaseString
// stores it (ASCII only, absl::AsciiStrToLower), and value.
func (a *textArena) pair(name, value string) (string, string) {
	if len(name)+len(value) == 0 {
		return "", ""
	}
	r := a.room(len(name) + len(value))
	copy(r, name)
	lowerASCII(r[:len(name)])
	copy(r[len(name):], value)
	s := unsafe.String(&r[0], len(r))
	return s[:len(name)], s[len(name):]
}

// pairs decodes a header map a plugin passed in (DecodePairs), its names
// lower-cased, into strings of the arena, with room for that many more
// headers.
func (a *textArena) pairs(b []byte, room int) []Header {
	if len(b) > maxPairsBytes || len(b) < 4 {
		return nil
	}
	buf := a.room(len(b))
	copy(buf, b)
	return decodePairs(buf, true, room)
}
