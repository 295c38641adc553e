package server

import (
	"math"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// sendLag tells how long a check waited between the proxy sending it
// (x-ratelimit-sent, the proxy's clock) and the sidecar reading it, without
// trusting the two clocks to agree: the least lag seen lately (transit
// plus whatever the clocks differ by) is the lag of a check that did not
// wait, and a check waited by what its lag exceeds it. The proxy and the
// sidecar run side by side, so the clocks are one, and the least lag is
// the quickest trip over loopback; proxies elsewhere each have a sendLag
// of their own (peerLags). sidecar/RATIONALE.md, "Why does the sidecar not
// decide a check the proxy has given up on?".
//
// The least lag is kept over two windows of lagWindow, the current and the
// one before, so it follows a clock that drifts and forgets a step within
// two windows.
type sendLag struct {
	window    atomic.Int64 // the current window's number: Unix time / lagWindow
	cur, prev atomic.Int64 // least lag in µs seen in that window and the one before; noLag: none
}

const (
	lagWindow = 10 * time.Second
	noLag     = math.MaxInt64
	// maxLag bounds a lag taken for a wait: a proxy clock further off than
	// this is not a queue, and its checks are taken as not having waited.
	maxLag = int64(time.Minute / time.Microsecond)
)

func newSendLag() *sendLag {
	l := &sendLag{}
	l.cur.Store(noLag)
	l.prev.Store(noLag)
	return l
}

// waited returns how long a check sent at sentUs (µs since the epoch, the
// proxy's clock) and read at now waited beyond the least lag seen lately,
// and records its lag. ok is false, and the wait 0, when the clocks are
// further apart than maxLag.
func (l *sendLag) waited(now time.Time, sentUs int64) (_ time.Duration, ok bool) {
	lag := now.UnixMicro() - sentUs
	if lag > maxLag || lag < -maxLag {
		return 0, false
	}
	if w := now.UnixNano() / int64(lagWindow); w != l.window.Load() {
		l.turn(w)
	}
	for {
		c := l.cur.Load()
		if lag >= c || l.cur.CompareAndSwap(c, lag) {
			break
		}
	}
	least := min(l.cur.Load(), l.prev.Load())
	return time.Duration(lag-least) * time.Microsecond, true
}

// turn starts window w. Checks racing it may record a lag in either
// window: the least lag moves by no more than those lags differ.
func (l *sendLag) turn(w int64) {
	old := l.window.Load()
	if old == w || !l.window.CompareAndSwap(old, w) {
		return
	}
	if w == old+1 {
		l.prev.Store(l.cur.Load())
	} else {
		l.prev.Store(noLag)
	}
	l.cur.Store(noLag)
}

// peerLags keeps a sendLag for each address checks come from. Proxies on
// other hosts have clocks of their own: with one least lag for all of them,
// the checks of a proxy whose clock is behind another's by more than the
// proxy's wait would all read as having waited that long. Connections
// from one address share its clock, so a connection's first check is
// measured against the address's quickest trip.
type peerLags struct {
	list atomic.Pointer[[]peerLag] // replaced whole, under mu
	mu   sync.Mutex
}

type peerLag struct {
	addr netip.Addr
	lag  *sendLag
}

// maxPeers bounds the addresses tracked at once: a sidecar serves the
// proxy beside it, and a few at most share one. A peer not seen for two
// windows has forgotten its least lag and is dropped; while maxPeers others
// are live, a new address's checks are taken as not having waited.
const maxPeers = 64

// of returns ip's sendLag, nil when maxPeers others are live. An IPv4
// address and its IPv6-mapped form are one peer; an address that is not
// IP (a unix socket, a test's) is the zero address, one peer.
func (p *peerLags) of(ip net.IP, now time.Time) *sendLag {
	a, _ := netip.AddrFromSlice(ip)
	a = a.Unmap()
	if l := p.list.Load(); l != nil {
		for i := range *l {
			if (*l)[i].addr == a {
				return (*l)[i].lag
			}
		}
	}
	return p.add(a, now)
}

func (p *peerLags) add(a netip.Addr, now time.Time) *sendLag {
	p.mu.Lock()
	defer p.mu.Unlock()
	var old []peerLag
	if l := p.list.Load(); l != nil {
		old = *l
	}
	w := now.UnixNano() / int64(lagWindow)
	live := func(e peerLag) bool { return e.lag.window.Load() >= w-1 }
	n := 0
	for _, e := range old {
		if e.addr == a {
			return e.lag // added while this call waited for the lock
		}
		if live(e) {
			n++
		}
	}
	if n >= maxPeers {
		return nil // and nothing allocated for it
	}
	next := make([]peerLag, 0, n+1)
	for _, e := range old {
		if live(e) {
			next = append(next, e)
		}
	}
	l := newSendLag()
	l.window.Store(w) // live from now, though no check has been measured yet
	next = append(next, peerLag{a, l})
	p.list.Store(&next)
	return l
}
