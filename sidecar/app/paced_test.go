package app

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// pacedSender is one sender of a pacedLoad: the sidecar it asks, the key
// its checks carry and their x-ratelimit-region (none when empty).
type pacedSender struct{ addr, key, region string }

// pacedLoad sends checks at a steady pace, each sender on a goroutine of
// its own, perSender checks a second, each waiting for its answer.
type pacedLoad struct {
	sent []atomic.Int64 // checks sent so far, by sender
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// startPaced starts senders, and calls answered with the sender's index,
// when its check was sent, and the answer (valid during the call only) or
// the transport's error. The load stops at the test's end if not before.
func startPaced(t *testing.T, senders []pacedSender, perSender int, answered func(i int, sent time.Time, resp *fasthttp.Response, err error)) *pacedLoad {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &pacedLoad{sent: make([]atomic.Int64, len(senders)), stop: cancel}
	client := &fasthttp.Client{MaxConnsPerHost: 2 * len(senders)}
	for i, s := range senders {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			tick := time.NewTicker(time.Second / time.Duration(perSender))
			defer tick.Stop()
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				req.Reset()
				req.SetRequestURI("http://" + s.addr + "/v1/check")
				req.Header.SetMethod("POST")
				req.Header.Set("x-api-key", s.key)
				if s.region != "" {
					req.Header.Set("x-ratelimit-region", s.region)
				}
				sent := time.Now()
				p.sent[i].Add(1)
				err := client.DoTimeout(req, resp, 5*time.Second)
				answered(i, sent, resp, err)
			}
		}()
	}
	t.Cleanup(p.close)
	return p
}

// close stops the senders and returns once every answer has been handed to
// answered. It may be called more than once.
func (p *pacedLoad) close() { p.stop(); p.wg.Wait() }
