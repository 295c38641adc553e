package wasmhost

import (
	"encoding/binary"
	"fmt"
	"unsafe"
)

// trap is a panic value a host function raises to abort the call into the
// module, as a V8 trap does in Envoy; the VM is then marked failed.
type trap struct{ reason string }

func (t trap) Error() string { return t.reason }

// read copies n bytes at ptr out of the module's memory.
func (vm *VM) read(ptr, n uint32) ([]byte, bool) {
	b, ok := vm.mem.Read(ptr, n)
	if !ok {
		return nil, false
	}
	return append([]byte(nil), b...), true
}

// lookupKey is the n bytes at ptr as a string that is a view of the
// module's memory, not a copy: for a name the host function only looks up
// and compares before anything else runs in the module (an allocation
// there may move the memory), never one it keeps.
func (vm *VM) lookupKey(ptr, n uint32) (string, bool) {
	b, ok := vm.mem.Read(ptr, n)
	if !ok {
		return "", false
	}
	if len(b) == 0 {
		return "", true
	}
	return unsafe.String(&b[0], len(b)), true
}

func (vm *VM) readString(ptr, n uint32) (string, bool) {
	b, ok := vm.mem.Read(ptr, n)
	if !ok {
		return "", false
	}
	return string(b), true
}

func (vm *VM) writeU32(ptr, v uint32) bool { return vm.mem.WriteUint32Le(ptr, v) }

func (vm *VM) writeU64(ptr uint32, v uint64) bool { return vm.mem.WriteUint64Le(ptr, v) }

func (vm *VM) write(ptr uint32, b []byte) bool { return vm.mem.Write(ptr, b) }

// alloc asks the module for n bytes with its allocator (malloc, else
// proxy_on_memory_allocate). Meanwhile only the host calls Envoy allows
// during an allocation may run. It returns 0 when the module has none to
// give; a trap inside the allocator traps the calling host function too.
func (vm *VM) alloc(n uint32) uint32 {
	f := vm.allocator
	prev := vm.allowed
	vm.allowed = mallocAllowed(vm.mod.poll)
	res, err := vm.callWithStack(f, uint64(n))
	vm.allowed = prev
	if err != nil {
		panic(trap{fmt.Sprintf("%s(%d): %v", vm.mod.alloc, n, err)})
	}
	ptr := uint32(res)
	if ptr == 0 {
		return 0
	}
	if _, ok := vm.mem.Read(ptr, n); !ok {
		return 0
	}
	return ptr
}

// copyOut hands data to the module as Envoy's copyToPointerSize does: it
// allocates a copy (none for empty data, whose pointer is 0) and writes the
// pointer and the length where the module asked. A string goes as it is,
// without a conversion to bytes first.
func copyOut[T string | []byte](vm *VM, data T, ptrPtr, sizePtr uint32) Status {
	dst, st := vm.handOut(len(data), ptrPtr, sizePtr)
	copy(dst, data)
	return st
}

// handOut is copyOut for n bytes the caller writes itself, into the view
// of the module's memory it returns (nil unless the status is OK), before
// anything else runs in the module.
func (vm *VM) handOut(n int, ptrPtr, sizePtr uint32) ([]byte, Status) {
	var ptr uint32
	var dst []byte
	if n > 0 {
		if ptr = vm.alloc(uint32(n)); ptr == 0 {
			return nil, StatusInvalidMemAccess
		}
		var ok bool
		if dst, ok = vm.mem.Read(ptr, uint32(n)); !ok {
			return nil, StatusInvalidMemAccess
		}
	}
	if !vm.writeU32(ptrPtr, ptr) || !vm.writeU32(sizePtr, uint32(n)) {
		return nil, StatusInvalidMemAccess
	}
	return dst, StatusOK
}

func le32(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
