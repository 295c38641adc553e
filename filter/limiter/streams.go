package limiter

// streamTable maps the proxy's context ids, or a root's callout tokens, to
// their streams. Every request adds and removes an entry in two of these, so
// they are open-addressing tables with linear probing rather than Go maps:
// inside wazero a map insert and delete cost about 0.5 µs together (the
// runtime's hashing, its per-map seed drawn again whenever the map empties,
// slot clearing with write barriers), this table a small fraction of it.
// filter/RATIONALE.md, "Why the stream tables are not maps", has the
// numbers.
//
// An empty slot has a nil stream, so every uint32 is a valid key. Deletion
// shifts the following entries of the run back, so a lookup never has to
// step over tombstones.
type streamTable struct {
	slots []streamSlot // len is 0 or a power of two
	n     int
}

type streamSlot struct {
	key uint32
	s   *stream
}

// minStreamSlots is the first size: room for the requests a VM usually has
// in flight before the table has to grow.
const minStreamSlots = 64

// home is key's first slot: Fibonacci hashing spreads the proxy's
// consecutive ids over the table.
func (t *streamTable) home(key uint32) int {
	return int((key * 0x9e3779b1) & uint32(len(t.slots)-1))
}

func (t *streamTable) get(key uint32) *stream {
	if t.n == 0 {
		return nil
	}
	mask := len(t.slots) - 1
	for i := t.home(key); ; i = (i + 1) & mask {
		sl := &t.slots[i]
		if sl.s == nil {
			return nil
		}
		if sl.key == key {
			return sl.s
		}
	}
}

// put sets key's stream (s not nil), replacing any it had.
func (t *streamTable) put(key uint32, s *stream) {
	if 2*(t.n+1) > len(t.slots) {
		t.grow()
	}
	mask := len(t.slots) - 1
	for i := t.home(key); ; i = (i + 1) & mask {
		sl := &t.slots[i]
		if sl.s == nil {
			sl.key, sl.s = key, s
			t.n++
			return
		}
		if sl.key == key {
			sl.s = s
			return
		}
	}
}

// remove deletes key and returns its stream, nil when it had none.
func (t *streamTable) remove(key uint32) *stream {
	if t.n == 0 {
		return nil
	}
	mask := len(t.slots) - 1
	i := t.home(key)
	for ; ; i = (i + 1) & mask {
		if t.slots[i].s == nil {
			return nil
		}
		if t.slots[i].key == key {
			break
		}
	}
	s := t.slots[i].s
	// Shift back every later entry of the run that may sit in the freed
	// slot: one whose home is not cyclically within (i, j].
	for j := (i + 1) & mask; t.slots[j].s != nil; j = (j + 1) & mask {
		if h := t.home(t.slots[j].key); (j-h)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = streamSlot{}
	t.n--
	return s
}

func (t *streamTable) grow() {
	old := t.slots
	t.slots = make([]streamSlot, max(minStreamSlots, 2*len(old)))
	t.n = 0
	for _, sl := range old {
		if sl.s != nil {
			t.put(sl.key, sl.s)
		}
	}
}
