//go:build wasip1

// Command probe is a proxy-wasm module that tests the headless host: each
// callback runs a small script of host calls taken from the plugin
// configuration (one "[phase]" section per callback) and logs every result
// as "probe: <command>=<status> ...", which the tests read back.
package main

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

var (
	// allocs keeps what the host asked for alive until the next callback.
	allocs    [][]byte
	allocHook string
	lastToken uint32
	lastCAS   uint32
	lastID    uint32
	// callers maps an HTTP call's token to the context that made it, and
	// cbToken is the token of the callback running.
	callers = map[uint32]uint32{}
	cbToken uint32
	ballast [][]byte
)

func init() {
	// vm_config environment variables reach the module through WASI, which
	// Envoy allows during initialization.
	allocHook = os.Getenv("PROBE_ALLOC")
	if s := os.Getenv("PROBE_INIT"); s != "" {
		for _, line := range strings.Split(s, ";") {
			exec(line)
		}
	}
}

func main() {}

func parseSections(text string) map[string]string {
	out := map[string]string{}
	section := ""
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = line[1 : len(line)-1]
			continue
		}
		if line != "" {
			out[section] += line + "\n"
		}
	}
	return out
}

// run executes the script of a phase and returns what the callback returns
// unless a "return" command said otherwise: 0 (continue) for the header
// phases, 1 (true) for the others.
func run(phase string, id uint32) uint32 {
	allocs = allocs[:0]
	result = 1
	if phase == "request_headers" || phase == "response_headers" {
		result = 0
	}
	current = id
	for _, line := range strings.Split(script(id)[phase], "\n") {
		if line != "" {
			exec(line)
		}
	}
	return result
}

var (
	result  uint32
	current uint32
)

func logf(format string, a ...any) {
	msg := "probe: " + fmt.Sprintf(format, a...)
	proxyLog(2, ptrOf([]byte(msg)), uint32(len(msg)))
}

func arg(s string) string {
	v, err := url.PathUnescape(s)
	if err != nil {
		return s
	}
	return v
}

func num(s string) uint32 {
	switch s {
	case "last":
		return lastID
	case "token":
		return lastToken
	case "cas":
		return lastCAS
	case "stream":
		return lastStream
	case "caller":
		return callers[cbToken]
	case "self":
		return current
	}
	n, _ := strconv.ParseInt(s, 10, 64)
	return uint32(n)
}

// pairs encodes "k=v,k=v" (components path-escaped) in the map format.
func pairs(s string) []byte {
	var kv [][2]string
	if s != "-" && s != "" {
		for _, p := range strings.Split(s, ",") {
			k, v, _ := strings.Cut(p, "=")
			kv = append(kv, [2]string{arg(k), arg(v)})
		}
	}
	if len(kv) == 0 {
		return nil
	}
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(kv)))
	for _, p := range kv {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[0])))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[1])))
	}
	for _, p := range kv {
		b = append(append(b, p[0]...), 0)
		b = append(append(b, p[1]...), 0)
	}
	return b
}

func decodePairs(b []byte) string {
	if len(b) < 4 {
		return ""
	}
	n := binary.LittleEndian.Uint32(b)
	pos := 4 + 8*int(n)
	var out []string
	for i := 0; i < int(n); i++ {
		kl := int(binary.LittleEndian.Uint32(b[4+8*i:]))
		vl := int(binary.LittleEndian.Uint32(b[8+8*i:]))
		k := string(b[pos : pos+kl])
		pos += kl + 1
		v := string(b[pos : pos+vl])
		pos += vl + 1
		out = append(out, url.PathEscape(k)+"="+url.PathEscape(v))
	}
	return strings.Join(out, ",")
}

func exec(line string) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return
	}
	a := func(i int) string {
		if i < len(f) {
			return f[i]
		}
		return ""
	}
	cmd := f[0]
	out := func(st uint32, format string, x ...any) {
		logf("%s=%d %s", cmd, st, fmt.Sprintf(format, x...))
	}
	switch cmd {
	case "return":
		result = num(a(1))
	case "log":
		m := arg(a(2))
		out(proxyLog(num(a(1)), ptrOf([]byte(m)), uint32(len(m))), "")
	case "badmem":
		out(proxyLog(2, unsafe.Pointer(uintptr(0x7ffffff0)), 64), "")
	case "loglevel":
		var l uint32
		st := proxyGetLogLevel(&l)
		out(st, "level=%d", l)
	case "buf":
		var ptr, n uint32
		st := proxyGetBufferBytes(num(a(1)), num(a(2)), num(a(3)), &ptr, &n)
		out(st, "ptr0=%t len=%d data=%s", ptr == 0, n, url.PathEscape(string(hostBytes(ptr, n))))
	case "bufstatus":
		var n, flags uint32
		st := proxyGetBufferStatus(num(a(1)), &n, &flags)
		out(st, "len=%d", n)
	case "get":
		k := arg(a(2))
		var ptr, n uint32
		st := proxyGetHeaderMapValue(num(a(1)), ptrOf([]byte(k)), uint32(len(k)), &ptr, &n)
		out(st, "value=%s", url.PathEscape(string(hostBytes(ptr, n))))
	case "pairs":
		var ptr, n uint32
		st := proxyGetHeaderMapPairs(num(a(1)), &ptr, &n)
		out(st, "ptr0=%t pairs=%s", ptr == 0, decodePairs(hostBytes(ptr, n)))
	case "setpairs":
		b := pairs(a(2))
		out(proxySetHeaderMapPairs(num(a(1)), ptrOf(b), uint32(len(b))), "")
	case "setpairsraw":
		b, _ := hex.DecodeString(a(2))
		out(proxySetHeaderMapPairs(num(a(1)), ptrOf(b), uint32(len(b))), "")
	case "size":
		var n uint32
		st := proxyGetHeaderMapSize(num(a(1)), &n)
		out(st, "size=%d", n)
	case "add", "replace":
		k, v := []byte(arg(a(2))), []byte(arg(a(3)))
		fn := proxyAddHeaderMapValue
		if cmd == "replace" {
			fn = proxyReplaceHeaderMapValue
		}
		out(fn(num(a(1)), ptrOf(k), uint32(len(k)), ptrOf(v), uint32(len(v))), "")
	case "remove":
		k := []byte(arg(a(2)))
		out(proxyRemoveHeaderMapValue(num(a(1)), ptrOf(k), uint32(len(k))), "")
	case "call", "callraw":
		cluster := []byte(arg(a(1)))
		var h []byte
		if cmd == "call" {
			h = pairs(a(2))
		} else {
			h, _ = hex.DecodeString(a(2))
		}
		body := []byte(arg(a(3)))
		if a(3) == "-" {
			body = nil
		}
		var token uint32
		st := proxyHTTPCall(ptrOf(cluster), uint32(len(cluster)), ptrOf(h), uint32(len(h)),
			ptrOf(body), uint32(len(body)), nil, 0, num(a(4)), &token)
		if st == 0 {
			lastToken = token
			callers[token] = current
		}
		out(st, "token=%d", token)
	case "local":
		details, body, h := []byte(arg(a(2))), []byte(arg(a(3))), pairs(a(4))
		if a(3) == "-" {
			body = nil
		}
		grpc, _ := strconv.Atoi(a(5))
		out(proxySendLocalResponse(num(a(1)), ptrOf(details), uint32(len(details)), ptrOf(body), uint32(len(body)),
			ptrOf(h), uint32(len(h)), int32(grpc)), "")
	case "continue":
		out(proxyContinueStream(num(a(1))), "")
	case "close":
		out(proxyCloseStream(num(a(1))), "")
	case "effective":
		out(proxySetEffectiveContext(num(a(1))), "")
	case "prop":
		p := []byte(arg(a(1)))
		var ptr, n uint32
		st := proxyGetProperty(ptrOf(p), uint32(len(p)), &ptr, &n)
		out(st, "value=%s", url.PathEscape(string(hostBytes(ptr, n))))
	case "setprop":
		k, v := []byte(arg(a(1))), []byte(arg(a(2)))
		out(proxySetProperty(ptrOf(k), uint32(len(k)), ptrOf(v), uint32(len(v))), "")
	case "sget":
		k := []byte(arg(a(1)))
		var ptr, n, cas uint32
		st := proxyGetSharedData(ptrOf(k), uint32(len(k)), &ptr, &n, &cas)
		if st == 0 {
			lastCAS = cas
		}
		out(st, "value=%s cas=%d", url.PathEscape(string(hostBytes(ptr, n))), cas)
	case "sset":
		k, v := []byte(arg(a(1))), []byte(arg(a(2)))
		out(proxySetSharedData(ptrOf(k), uint32(len(k)), ptrOf(v), uint32(len(v)), num(a(3))), "")
	case "define":
		name := []byte(arg(a(2)))
		var id uint32
		st := proxyDefineMetric(num(a(1)), ptrOf(name), uint32(len(name)), &id)
		if st == 0 {
			lastID = id
		}
		out(st, "id=%d", id)
	case "inc":
		d, _ := strconv.ParseInt(a(2), 10, 64)
		out(proxyIncrementMetric(num(a(1)), d), "")
	case "record":
		v, _ := strconv.ParseUint(a(2), 10, 64)
		out(proxyRecordMetric(num(a(1)), v), "")
	case "getm":
		var v uint64
		st := proxyGetMetric(num(a(1)), &v)
		out(st, "value=%d", v)
	case "tick":
		out(proxySetTickPeriod(num(a(1))), "")
	case "now":
		var ns uint64
		st := proxyGetCurrentTime(&ns)
		out(st, "ns=%d", ns)
	case "status":
		var code, ptr, n uint32
		st := proxyGetStatus(&code, &ptr, &n)
		out(st, "code=%d msg=%s", code, url.PathEscape(string(hostBytes(ptr, n))))
	case "foreign":
		name := []byte(arg(a(1)))
		var rp, rn uint32
		out(proxyCallForeignFunction(ptrOf(name), uint32(len(name)), nil, 0, &rp, &rn), "")
	case "done":
		out(proxyDone(), "")
	case "stdout":
		fmt.Fprintln(os.Stdout, arg(a(1)))
	case "stderr":
		fmt.Fprintln(os.Stderr, arg(a(1)))
	case "parent":
		// The root context this context was created under (0: a root).
		logf("parent=%d", parents[current])
	case "env":
		logf("env=%s", os.Getenv(a(1)))
	case "environ":
		logf("environ=%s", strings.Join(os.Environ(), ","))
	case "args":
		logf("args=%d", len(os.Args))
	case "readfile":
		readFile(a(1))
	case "clock":
		logf("clock=%d", time.Now().UnixNano())
	case "random":
		b := make([]byte, num(a(1)))
		_, err := rand.Read(b)
		logf("random=%v n=%d", err, len(b))
	case "sleep":
		time.Sleep(time.Duration(num(a(1))) * time.Millisecond)
		logf("sleep=ok")
	case "gc":
		churn(int(num(a(1))))
		logf("gc=ok")
	case "panic":
		panic(arg(a(1)))
	default:
		logf("unknown=%s", cmd)
	}
}

// churn makes garbage and collects it n times, keeping a little ballast so
// the heap is not trivially empty.
func churn(n int) {
	for i := 0; i < n; i++ {
		junk := make([][]byte, 0, 256)
		for j := 0; j < 256; j++ {
			junk = append(junk, make([]byte, 1024))
		}
		ballast = append(ballast, junk[i%len(junk)])
		if len(ballast) > 64 {
			ballast = ballast[1:]
		}
		runtime.GC()
	}
}
