package wasmhost

import (
	"crypto/rand"
	"encoding/binary"
	"sort"
	"strings"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// WASI errno values Envoy answers with.
const (
	errnoSuccess  = 0
	errnoBadf     = 8
	errnoWeird20  = 20 // what Envoy's fd_readdir returns (its comment says ENOTDIR)
	errnoFault    = 21
	errnoInval    = 28
	errnoNoent    = 44
	errnoNosys    = 52
	errnoNotsup   = 58
	maxRandomSize = 64 << 10
)

// legacyWASI is the WASI function set of Envoy before proxy-wasm-cpp-host's
// April 2026 update; a module importing anything else fails to link there.
var legacyWASI = set("fd_write", "fd_read", "fd_seek", "fd_close", "fd_fdstat_get",
	"fd_fdstat_set_flags", "environ_get", "environ_sizes_get", "args_get", "args_sizes_get",
	"clock_time_get", "random_get", "sched_yield", "poll_oneoff", "proc_exit", "path_open",
	"fd_prestat_get", "fd_prestat_dir_name")

func isStdio(fd uint32) bool { return fd == 1 || fd == 2 }

// wasiFunctions returns Envoy's WASI stubs under module name mod. The
// signatures are Envoy's, including where they differ from the WASI
// specification (path_link, path_symlink): a module importing the
// specification's signature fails to link in Envoy, and here too.
func wasiFunctions(poll PollMode, mod string) []hostFunc {
	errno := func(name string, params []api.ValueType, fn func(vm *VM, s []uint64) uint32) hostFunc {
		return hostFunc{module: mod, name: name, params: params, results: ints(1),
			fn: func(vm *VM, s []uint64) { s[0] = uint64(fn(vm, s)) }}
	}
	const0 := func(v uint32) func(*VM, []uint64) uint32 { return func(*VM, []uint64) uint32 { return v } }
	stdioOnly := func(_ *VM, s []uint64) uint32 {
		if isStdio(u32(s[0])) {
			return errnoSuccess
		}
		return errnoBadf
	}
	fs := []hostFunc{
		errno("fd_write", ints(4), func(vm *VM, s []uint64) uint32 {
			n, e := vm.writev(u32(s[0]), u32(s[1]), u32(s[2]))
			if e != errnoSuccess {
				return e
			}
			if !vm.writeU32(u32(s[3]), n) {
				return errnoFault
			}
			return errnoSuccess
		}),
		errno("fd_read", ints(4), const0(errnoNosys)),
		errno("fd_seek", types(i32, i64, i32, i32), func(vm *VM, _ []uint64) uint32 {
			vm.log(LogTrace, "wasi_unstable fd_seek")
			return errnoSuccess
		}),
		errno("fd_close", ints(1), func(vm *VM, _ []uint64) uint32 {
			vm.log(LogTrace, "wasi_unstable fd_close")
			return errnoSuccess
		}),
		errno("fd_fdstat_get", ints(2), func(vm *VM, s []uint64) uint32 {
			if !isStdio(u32(s[0])) {
				return errnoBadf
			}
			// A character-less stat whose only right is FD_WRITE (64).
			var st [24]byte
			binary.LittleEndian.PutUint64(st[8:], 64)
			vm.write(u32(s[1]), st[:])
			return errnoSuccess
		}),
		errno("fd_fdstat_set_flags", ints(2), const0(errnoNosys)),
		errno("environ_get", ints(2), func(vm *VM, s []uint64) uint32 {
			array, buf := u32(s[0]), u32(s[1])
			for _, kv := range vm.environ() {
				if !vm.writeU32(array, buf) || !vm.write(buf, append([]byte(kv), 0)) {
					return errnoFault
				}
				buf += uint32(len(kv) + 1)
				array += 4
			}
			return errnoSuccess
		}),
		errno("environ_sizes_get", ints(2), func(vm *VM, s []uint64) uint32 {
			env := vm.environ()
			size := 0
			for _, kv := range env {
				size += len(kv) + 1
			}
			if !vm.writeU32(u32(s[0]), uint32(len(env))) || !vm.writeU32(u32(s[1]), uint32(size)) {
				return errnoFault
			}
			return errnoSuccess
		}),
		errno("args_get", ints(2), const0(errnoSuccess)),
		errno("args_sizes_get", ints(2), func(vm *VM, s []uint64) uint32 {
			if !vm.writeU32(u32(s[0]), 0) || !vm.writeU32(u32(s[1]), 0) {
				return errnoFault
			}
			return errnoSuccess
		}),
		errno("clock_time_get", types(i32, i64, i32), func(vm *VM, s []uint64) uint32 {
			var t uint64
			switch u32(s[0]) {
			case 0: // realtime
				t = uint64(vm.o.Clock.Now().UnixNano())
			case 1: // monotonic
				t = uint64(vm.o.Clock.Monotonic())
			default:
				return errnoNotsup
			}
			if !vm.writeU64(u32(s[2]), t) {
				return errnoFault
			}
			return errnoSuccess
		}),
		errno("random_get", ints(2), func(vm *VM, s []uint64) uint32 {
			n := u32(s[1])
			if n > maxRandomSize {
				return errnoInval
			}
			if n == 0 {
				return errnoSuccess
			}
			b := make([]byte, n)
			rand.Read(b)
			if !vm.write(u32(s[0]), b) {
				return errnoFault
			}
			return errnoSuccess
		}),
		errno("sched_yield", nil, const0(errnoSuccess)),
		errno("poll_oneoff", ints(4), func(vm *VM, s []uint64) uint32 {
			return vm.pollOneoff(u32(s[0]), u32(s[1]), u32(s[2]), u32(s[3]))
		}),
		{module: mod, name: "proc_exit", params: ints(1), fn: func(vm *VM, s []uint64) {
			vm.procExit(u32(s[0]))
		}},
		errno("path_open", types(i32, i32, i32, i32, i32, i64, i64, i32, i32), const0(errnoNoent)),
		errno("fd_prestat_get", ints(2), const0(errnoBadf)),
		errno("fd_prestat_dir_name", ints(3), const0(errnoNosys)),

		// The rest came with proxy-wasm-cpp-host's April 2026 update.
		errno("fd_filestat_get", ints(2), const0(errnoBadf)),
		errno("path_filestat_get", ints(5), const0(errnoNotsup)),
		errno("clock_res_get", ints(2), func(vm *VM, s []uint64) uint32 {
			if id := u32(s[0]); id != 0 && id != 1 {
				return errnoNotsup
			}
			if !vm.writeU64(u32(s[1]), 1) {
				return errnoFault
			}
			return errnoSuccess
		}),
		errno("fd_advise", types(i32, i64, i64, i32), const0(errnoSuccess)),
		errno("fd_allocate", types(i32, i64, i64), stdioOnly),
		errno("fd_datasync", ints(1), stdioOnly),
		errno("fd_fdstat_set_rights", types(i32, i64, i64), stdioOnly),
		errno("fd_filestat_set_size", types(i32, i64), stdioOnly),
		errno("fd_filestat_set_times", types(i32, i64, i64, i32), stdioOnly),
		errno("fd_pread", types(i32, i32, i32, i64, i32), const0(errnoNosys)),
		errno("fd_pwrite", types(i32, i32, i32, i64, i32), func(vm *VM, s []uint64) uint32 {
			if !isStdio(u32(s[0])) {
				return errnoBadf
			}
			n, e := vm.writev(u32(s[0]), u32(s[1]), u32(s[2]))
			if e != errnoSuccess {
				return e
			}
			if !vm.writeU32(u32(s[4]), n) {
				return errnoFault
			}
			return errnoSuccess
		}),
		errno("fd_readdir", types(i32, i32, i32, i64, i32), func(vm *VM, s []uint64) uint32 {
			if !vm.writeU32(u32(s[4]), 0) {
				return errnoFault
			}
			return errnoWeird20
		}),
		errno("fd_renumber", ints(2), func(_ *VM, s []uint64) uint32 {
			if !isStdio(u32(s[0])) || !isStdio(u32(s[1])) {
				return errnoBadf
			}
			return errnoNotsup
		}),
		errno("fd_sync", ints(1), stdioOnly),
		errno("fd_tell", ints(2), func(vm *VM, s []uint64) uint32 {
			if !isStdio(u32(s[0])) {
				return errnoBadf
			}
			if !vm.writeU64(u32(s[1]), 0) {
				return errnoFault
			}
			return errnoSuccess
		}),
		errno("path_create_directory", ints(3), const0(errnoNotsup)),
		errno("path_filestat_set_times", types(i32, i32, i32, i32, i64, i64, i32), const0(errnoNotsup)),
		errno("path_link", ints(6), const0(errnoNotsup)),
		errno("path_readlink", ints(6), func(vm *VM, s []uint64) uint32 {
			if !vm.writeU32(u32(s[5]), 0) {
				return errnoFault
			}
			return errnoNotsup
		}),
		errno("path_remove_directory", ints(3), const0(errnoNotsup)),
		errno("path_rename", ints(6), const0(errnoNotsup)),
		errno("path_symlink", ints(4), const0(errnoNotsup)),
		errno("path_unlink_file", ints(3), const0(errnoNotsup)),
		errno("sock_accept", ints(3), func(vm *VM, s []uint64) uint32 {
			if !vm.writeU64(u32(s[2]), 0) {
				return errnoFault
			}
			return errnoNotsup
		}),
		errno("sock_recv", ints(6), func(vm *VM, s []uint64) uint32 {
			if !vm.writeU32(u32(s[4]), 0) || !vm.write(u32(s[5]), []byte{0, 0}) {
				return errnoFault
			}
			return errnoNotsup
		}),
		errno("sock_send", ints(5), func(vm *VM, s []uint64) uint32 {
			if !vm.writeU32(u32(s[4]), 0) {
				return errnoFault
			}
			return errnoNotsup
		}),
		errno("sock_shutdown", ints(2), const0(errnoNotsup)),
	}
	if poll != PollENOSYS {
		return fs
	}
	var legacy []hostFunc
	for _, f := range fs {
		if legacyWASI[f.name] {
			legacy = append(legacy, f)
		}
	}
	return legacy
}

// environ returns Options.Env as sorted KEY=VALUE strings.
func (vm *VM) environ() []string {
	out := make([]string, 0, len(vm.o.Env))
	for k, v := range vm.o.Env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// writev is Envoy's fd_write: stdout logs at info, stderr at error, one
// line per call with one trailing newline dropped; other descriptors are
// bad.
func (vm *VM) writev(fd, iovs, n uint32) (uint32, uint32) {
	var level LogLevel
	switch fd {
	case 1:
		level = LogInfo
	case 2:
		level = LogError
	default:
		return 0, errnoBadf
	}
	var b strings.Builder
	for i := uint32(0); i < n; i++ {
		iov, ok := vm.mem.Read(iovs+8*i, 8)
		if !ok {
			return 0, errnoFault
		}
		ptr, l := le32(iov), le32(iov[4:])
		if l == 0 {
			continue
		}
		data, ok := vm.mem.Read(ptr, l)
		if !ok {
			return 0, errnoFault
		}
		b.Write(data)
	}
	s := b.String()
	written := uint32(len(s))
	if s != "" {
		vm.log(level, strings.TrimSuffix(s, "\n"))
	}
	return written, errnoSuccess
}

// procExit is WASI proc_exit. Envoy only logs it and returns, leaving the
// module to run on (a Go module then panics again and traps); this host
// ends the call there, which fails the VM at once with the same outcome.
func (vm *VM) procExit(code uint32) {
	vm.log(LogTrace, "wasi_unstable proc_exit")
	panic(trap{"proc_exit(" + itoa(code) + ")"})
}

func itoa(v uint32) string {
	var b [10]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			return string(b[i:])
		}
	}
}

// WASI poll_oneoff layout: a subscription is 48 bytes (userdata u64 at 0,
// tag u8 at 8, then for a clock: id u32 at 16, timeout u64 at 24, flags u16
// at 40); an event is 32 bytes (userdata u64 at 0, error u16 at 8, type u8
// at 10).
const (
	subscriptionSize = 48
	eventSize        = 32
	subClock         = 0
	flagAbstime      = 1
)

func (vm *VM) pollOneoff(in, out, nsubs, neventsPtr uint32) uint32 {
	vm.pollCalls.Add(1)
	switch vm.mod.poll {
	case PollENOSYS:
		return errnoNosys
	case PollNoEvents:
		if !vm.writeU32(neventsPtr, 0) {
			return errnoFault
		}
		return errnoSuccess
	}
	if nsubs == 0 {
		return errnoInval
	}
	subs, ok := vm.read(in, nsubs*subscriptionSize)
	if !ok {
		return errnoFault
	}
	type due struct {
		userdata uint64
		wait     time.Duration
	}
	var clocks []due
	var events [][]byte
	for i := uint32(0); i < nsubs; i++ {
		sub := subs[i*subscriptionSize : (i+1)*subscriptionSize]
		userdata := binary.LittleEndian.Uint64(sub)
		tag := sub[8]
		ev := make([]byte, eventSize)
		binary.LittleEndian.PutUint64(ev, userdata)
		ev[10] = tag
		if tag != subClock {
			// No descriptor can be polled: report it bad at once.
			binary.LittleEndian.PutUint16(ev[8:], errnoBadf)
			events = append(events, ev)
			continue
		}
		id := binary.LittleEndian.Uint32(sub[16:])
		timeout := binary.LittleEndian.Uint64(sub[24:])
		flags := binary.LittleEndian.Uint16(sub[40:])
		wait := time.Duration(timeout)
		if flags&flagAbstime != 0 {
			now := uint64(vm.o.Clock.Monotonic())
			if id == 0 {
				now = uint64(vm.o.Clock.Now().UnixNano())
			}
			wait = 0
			if timeout > now {
				wait = time.Duration(timeout - now)
			}
		}
		clocks = append(clocks, due{userdata, wait})
	}
	if len(events) == 0 && len(clocks) > 0 {
		min := clocks[0].wait
		for _, c := range clocks[1:] {
			if c.wait < min {
				min = c.wait
			}
		}
		if min > 0 {
			t := time.NewTimer(min)
			select {
			case <-t.C:
			case <-vm.ctx.Done():
				t.Stop()
			}
		}
		for _, c := range clocks {
			if c.wait <= min {
				ev := make([]byte, eventSize)
				binary.LittleEndian.PutUint64(ev, c.userdata)
				ev[10] = subClock
				events = append(events, ev)
			}
		}
	}
	for i, ev := range events {
		if !vm.write(out+uint32(i)*eventSize, ev) {
			return errnoFault
		}
	}
	if !vm.writeU32(neventsPtr, uint32(len(events))) {
		return errnoFault
	}
	return errnoSuccess
}
