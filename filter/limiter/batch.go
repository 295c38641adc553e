package limiter

import (
	"strconv"

	"github.com/edgelimit/edgelimit/filter/abi"
)

// Batches: one callout for a client's requests that come together.
//
// A request whose client already has a callout on its way from this VM, for
// the same cost, does not send one of its own: it waits in that callout's
// queue (join). When the answer comes, the requests queued behind it go
// out together in one callout (flush) with x-ratelimit-count: n, and the
// sidecar answers how many of them its bucket admitted
// (x-ratelimit-admitted: k; 200 when all were, 429 otherwise). The first k
// that came are admitted, the rest denied, exactly as n checks one after
// the other would have been. A burst of thirty requests of one client at a
// proxy with two workers then costs about four callouts instead of thirty:
// the proxy's work per request, which in a burst is what made callouts miss
// their timeout, and the sidecar's and Redis's, shrink with it.
// filter/RATIONALE.md, "Why a client's requests share a callout".
//
// A queued request has spent part of its timeout waiting; the batch's
// callout gets what is left of the oldest one's (send). When the answer it
// waited for decided nothing (a timeout, a 503, a reset), the queued
// requests share that failure rather than ask again: the sidecar has just
// shown it cannot answer, and their time is mostly spent.

// join queues s behind the callout on its way for its client and cost, if
// there is one with room in its queue (max_batch), and reports whether it
// did.
func (l *Limiter) join(s *stream) bool {
	r := s.root
	if r.cfg.MaxBatch < 2 || r.calls.n == 0 {
		return false
	}
	limit := int64(r.cfg.MaxBatch)
	for i := range r.calls.slots {
		c := r.calls.slots[i].s
		if c == nil || c.cost != s.cost || c.queued >= limit || c.key != s.key {
			continue
		}
		s.pending, s.waiting, s.lead = true, true, c
		if c.tail == nil {
			c.queue = s
		} else {
			c.tail.next = s
		}
		c.tail = s
		c.queued++
		return true
	}
	return false
}

// flush sends the requests that waited in queue for the answer a to the
// callout of prev. Each is first asked of the deny cache, which the answer
// may just have filled, so that a client past its bucket is answered
// without another callout; the rest go out as one batch, led by the
// oldest. When a decided nothing, they share its failure.
func (l *Limiter) flush(r *root, prev, queue *stream, a *Answer, now int64) {
	h := l.host
	var lead, last *stream
	for w := queue; w != nil; {
		next := w.next
		w.next = nil
		switch {
		case w.gone:
			w.pending, w.waiting = false, false
			l.release(w)
		case w.settled || h.SetEffectiveContext(w.id) != abi.StatusOK:
			w.pending, w.waiting = false, false
		case a.Outcome == FailedOpen:
			w.pending, w.waiting = false, false
			l.undecided(w, a.Reason, a.Detail, now)
		default:
			if act, denied := l.fromCache(w, now); denied {
				w.pending, w.waiting = false, false
				if act == abi.ActionContinue {
					l.resume(w) // a shadow request, told "deny"
				}
				break
			}
			// Until the batch is sent, its requests still wait for
			// prev's answer, which abandon finds them by.
			if lead == nil {
				lead, w.n = w, 1
			} else {
				if last == lead {
					lead.members = w
				} else {
					last.next = w
				}
				lead.n++
				lead.entry = lead.entry || w.entry
			}
			last = w
		}
		w = next
	}
	if lead == nil {
		return
	}
	reason, detail := ReasonCircuitOpen, "circuit breaker open"
	if b := &r.breaker; b.enabled() {
		allow, probe := b.allow(h, now)
		lead.probe = allow && probe
		if lead.probe {
			l.m.recordState(h, phaseHalfOpen)
		}
		if !allow {
			l.failBatch(lead, reason, detail, now)
			return
		}
	}
	// The callout is the oldest's: Envoy ties it to the effective
	// context's root, a test host to the stream.
	h.SetEffectiveContext(lead.id)
	if st := l.send(lead, now); st != abi.StatusOK {
		l.failBatch(lead, ReasonDispatch, "proxy_http_call failed: "+st.String(), now)
		return
	}
	lead.waiting, lead.lead = false, nil
	for m := lead.members; m != nil; m = m.next {
		m.lead = lead
	}
	if lead.n > 1 {
		l.m.add(h, cBatched, lead.n-1)
	}
}

// failBatch fails open (or through the local bucket) every request of the
// batch lead leads, which no callout will decide.
func (l *Limiter) failBatch(lead *stream, r Reason, detail string, now int64) {
	members := lead.members
	lead.members = nil
	for w := lead; w != nil; {
		next := w.next
		if w == lead {
			next = members
		}
		w.next, w.lead, w.pending, w.waiting = nil, nil, false, false
		if l.host.SetEffectiveContext(w.id) == abi.StatusOK && !l.failOpen(w, r, detail, now) {
			l.resume(w)
		}
		w = next
	}
}

// batchAdmitted returns how many of the n requests a callout decided a
// admitted, checking a batch's answer: x-ratelimit-admitted must be
// present, at most n, and n exactly when the status is 200. An answer
// that breaks this is malformed, and the requests fail open.
func batchAdmitted(a *Answer, n int64) int64 {
	switch {
	case a.Outcome != Allowed && a.Outcome != Denied:
		return 0
	case n <= 1:
		if a.Outcome == Allowed {
			return 1
		}
		return 0
	case a.HasAdmitted && a.Admitted <= n && (a.Admitted == n) == (a.Outcome == Allowed):
		return a.Admitted
	}
	*a = failed(ReasonMalformed, "sidecar answered a batch of "+strconv.FormatInt(n, 10)+
		" without a valid x-ratelimit-admitted", a.Status)
	return 0
}

// abandon fails open, after a recovered panic, every request still waiting
// for the callout of s: s itself, its members, and those queued behind it.
// They are found among the VM's streams, so that no request is left paused
// whatever state the panic left the lists in.
func (l *Limiter) abandon(s *stream) {
	rescue := func(w *stream) {
		if w.gone || w.settled || l.host.SetEffectiveContext(w.id) != abi.StatusOK {
			return
		}
		l.m.failedOpen(l.host, ReasonInternal)
		l.resume(w)
	}
	rescue(s)
	for i := range l.streams.slots {
		if w := l.streams.slots[i].s; w != nil && w.waiting && w.lead == s {
			w.pending, w.waiting, w.lead, w.next = false, false, nil, nil
			rescue(w)
		}
	}
}
