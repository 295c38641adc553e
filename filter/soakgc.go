//go:build wasip1 && soakgc

package main

import (
	"runtime"
	"runtime/debug"
	"strconv"
	_ "unsafe" // go:linkname

	"github.com/edgelimit/edgelimit/filter/abi"
	"github.com/edgelimit/edgelimit/filter/limiter"
)

// plugin, in the build for the garbage-collection soak only (-tags soakgc,
// never shipped): a memory limit and a low GOGC keep the collector and the
// scavenger busy, and every proxy_on_tick returns the free heap to the
// system at once (debug.FreeOSMemory: a collection the caller waits for,
// which lets the runtime's background goroutines run, then the scavenger's
// work done on the spot), which the runtime otherwise does by itself over
// hours of traffic. Each tick logs the runtime's state for the soak to read.
func plugin(l *limiter.Limiter) abi.Plugin {
	debug.SetGCPercent(10)
	debug.SetMemoryLimit(4 << 20)
	return soakPlugin{l}
}

type soakPlugin struct{ *limiter.Limiter }

// netpollInited is the runtime's own flag (an atomic.Uint32, read plainly:
// a wasm module has one thread), linked in by this build alone with
// -ldflags=-checklinkname=0. It turns 1 when the network poller starts,
// which the first runtime timer does.
//
//go:linkname netpollInited runtime.netpollInited
var netpollInited struct{ v uint32 }

func (p soakPlugin) OnTick(root uint32) {
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	abi.ProxyHost().Log(abi.LogInfo, "soakgc: gc_cycles="+strconv.FormatUint(uint64(m.NumGC), 10)+
		" netpoll_started="+strconv.FormatUint(uint64(netpollInited.v), 10)+
		" heap_released_kib="+strconv.FormatUint(m.HeapReleased>>10, 10))
	p.Limiter.OnTick(root)
}
