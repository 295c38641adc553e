// Package stats holds the sidecar's metrics and writes them in the Prometheus
// text format. No label ever carries an API key or its digest: clients are
// unbounded, labels must not be.
package stats

import (
	"io"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// LatencyBuckets are the upper bounds, in seconds, of the decision latency
// histogram: every half millisecond up to the gateway's 5 ms callout
// timeout, where a decision makes it in time or fails open. They are the
// bounds envoy/envoy.yaml gives the filter's callout latency histogram (in
// µs), so the two compare bucket for bucket.
var LatencyBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.0025, 0.003, 0.0035, 0.004, 0.0045, 0.005,
	0.0075, 0.01, 0.025, 0.1,
}

// BatchBuckets are the upper bounds of the pipeline batch size histogram.
var BatchBuckets = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256}

// Stats is every metric the sidecar exports. Each field is safe for
// concurrent use.
type Stats struct {
	set *metrics.Set

	// sidecar_decisions_total{result}: every /v1/check that reached a
	// decision or failed trying. "error" covers Redis errors and timeouts,
	// and checks that expired before they were read.
	Allowed, Denied, Errors *metrics.Counter
	// sidecar_requests_rejected_total{reason}: checks answered without a
	// decision: malformed (400) or an unknown key without default plan
	// (403); and requests the HTTP server could not read (400, 408, 413,
	// 431), which never reach a handler.
	BadRequests, UnknownKeys, Unreadable *metrics.Counter
	// sidecar_connections_refused_total{listener,reason}: connections
	// refused at accept, before any request: past the listener's
	// connections in all ("total", a 503) or, on the admin listener, past
	// those from one address ("per_address", a 429).
	RefusedCheck, RefusedAdmin, RefusedAdminPerAddress *metrics.Counter
	// sidecar_redis_errors_total: Redis answered with an error or the
	// connection failed. sidecar_redis_timeouts_total: no answer before the
	// sidecar's own deadline (-redis-timeout).
	RedisErrors, RedisTimeouts *metrics.Counter
	// sidecar_checks_expired_total: checks that waited unread for their
	// whole deadline (x-ratelimit-sent), too late to be answered within
	// the proxy's wait: the proxy lets their requests through, so they are
	// answered 503 without Redis and take no tokens.
	Expired *metrics.Counter
	// sidecar_checks_clock_off_total: checks whose x-ratelimit-sent was
	// more than a minute from the sidecar's clock: the proxy's clock and
	// the sidecar's disagree, so their waits are neither measured
	// (sidecar_check_wait_seconds) nor held to the proxy's deadline.
	ClockOff *metrics.Counter
	// sidecar_redis_script_loads_total: NOSCRIPT seen and the script resent.
	ScriptLoads *metrics.Counter
	// sidecar_denied_cached_total: of the denied decisions, those the deny
	// cache made without Redis (sidecar/denycache).
	DeniedCached *metrics.Counter
	// sidecar_deny_cache_full_total: denials the deny cache kept in a full
	// shard, none of its entries past its window, by evicting the entry a
	// check came for longest ago: each costs that bucket's next checks
	// their round trips to Redis.
	DenyCacheFull *metrics.Counter
	// sidecar_hot_reconcile_errors_total: a hot client's reconcile (its
	// demand written, its shares read or moved) that failed; the shares in
	// force are kept until one succeeds.
	HotReconcileErrors *metrics.Counter
	// sidecar_warm_ups_total{result}: the gateways' warm-up calls
	// (POST /v1/warm), answered ("ok") or not ("error"); no decision.
	WarmUps, WarmUpErrors *metrics.Counter
	// sidecar_decision_duration_seconds: from the request to its decision
	// (queueing and the Redis round trip), errors included.
	Latency *metrics.PrometheusHistogram
	// sidecar_check_wait_seconds: how long a check waited between the
	// proxy sending it (x-ratelimit-sent) and the sidecar reading it,
	// beyond the quickest trip seen from that proxy lately: the time it
	// spent in the sockets and queues before its decision began, which
	// sidecar_decision_duration_seconds does not see. It grows when the
	// sidecar is short of CPU. Checks without the header, or from a proxy
	// whose clock is too far off to tell a wait by, are not in it.
	Wait *metrics.PrometheusHistogram
	// sidecar_pipeline_batch_size: decisions per pipeline sent to Redis.
	Batch *metrics.PrometheusHistogram
	// sidecar_plans_reloads_total{result}: plan file reloads (SIGHUP or a
	// file change) that were applied ("ok") or rejected ("error").
	ReloadOK, ReloadFailed *metrics.Counter
	// InFlight is the number of /v1/check requests being handled
	// (sidecar_checks_in_flight).
	InFlight atomic.Int64
	// plansLoaded is the unix time in nanoseconds when the plans in force
	// were loaded, at start or by a reload
	// (sidecar_plans_last_reload_success_timestamp_seconds); 0 until then.
	plansLoaded atomic.Int64
	// reloadRefused: the last reload attempt was refused, so the plans in
	// force are not the file's (sidecar_plans_last_reload_successful 0)
	// until one succeeds.
	reloadRefused atomic.Bool
}

// Version is the sidecar's version in sidecar_build_info. Set it at link
// time (-ldflags "-X github.com/edgelimit/edgelimit/sidecar/stats.Version=1.2.3");
// left empty, the module version the Go toolchain stamped into the binary is
// used, or "(devel)".
var Version string

// BuildVersion returns the version sidecar_build_info reports.
func BuildVersion() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// New returns a fresh set of metrics, independent of any other Stats (tests
// run several sidecars in one process).
func New() *Stats {
	metrics.ExposeMetadata(true)
	s := metrics.NewSet()
	st := &Stats{
		set:                    s,
		Allowed:                s.NewCounter(`sidecar_decisions_total{result="allowed"}`),
		Denied:                 s.NewCounter(`sidecar_decisions_total{result="denied"}`),
		Errors:                 s.NewCounter(`sidecar_decisions_total{result="error"}`),
		BadRequests:            s.NewCounter(`sidecar_requests_rejected_total{reason="bad_request"}`),
		UnknownKeys:            s.NewCounter(`sidecar_requests_rejected_total{reason="unknown_key"}`),
		Unreadable:             s.NewCounter(`sidecar_requests_rejected_total{reason="unreadable"}`),
		RefusedCheck:           s.NewCounter(`sidecar_connections_refused_total{listener="check",reason="total"}`),
		RefusedAdmin:           s.NewCounter(`sidecar_connections_refused_total{listener="admin",reason="total"}`),
		RefusedAdminPerAddress: s.NewCounter(`sidecar_connections_refused_total{listener="admin",reason="per_address"}`),
		RedisErrors:            s.NewCounter(`sidecar_redis_errors_total`),
		RedisTimeouts:          s.NewCounter(`sidecar_redis_timeouts_total`),
		Expired:                s.NewCounter(`sidecar_checks_expired_total`),
		ClockOff:               s.NewCounter(`sidecar_checks_clock_off_total`),
		ScriptLoads:            s.NewCounter(`sidecar_redis_script_loads_total`),
		DeniedCached:           s.NewCounter(`sidecar_denied_cached_total`),
		DenyCacheFull:          s.NewCounter(`sidecar_deny_cache_full_total`),
		HotReconcileErrors:     s.NewCounter(`sidecar_hot_reconcile_errors_total`),
		WarmUps:                s.NewCounter(`sidecar_warm_ups_total{result="ok"}`),
		WarmUpErrors:           s.NewCounter(`sidecar_warm_ups_total{result="error"}`),
		Latency:                s.NewPrometheusHistogramExt(`sidecar_decision_duration_seconds`, LatencyBuckets),
		Wait:                   s.NewPrometheusHistogramExt(`sidecar_check_wait_seconds`, LatencyBuckets),
		Batch:                  s.NewPrometheusHistogramExt(`sidecar_pipeline_batch_size`, BatchBuckets),
		ReloadOK:               s.NewCounter(`sidecar_plans_reloads_total{result="ok"}`),
		ReloadFailed:           s.NewCounter(`sidecar_plans_reloads_total{result="error"}`),
	}
	s.NewGauge(`sidecar_checks_in_flight`, func() float64 { return float64(st.InFlight.Load()) })
	s.NewGauge(`sidecar_plans_last_reload_success_timestamp_seconds`, func() float64 {
		return float64(st.plansLoaded.Load()) / 1e9
	})
	s.NewGauge(`sidecar_plans_last_reload_successful`, func() float64 {
		if st.reloadRefused.Load() {
			return 0
		}
		return 1
	})
	s.NewGauge(`sidecar_build_info{version=`+strconv.Quote(BuildVersion())+`,goversion=`+strconv.Quote(runtime.Version())+`}`,
		func() float64 { return 1 })
	return st
}

// PlansLoaded records that plans were put in force at t (the first load at
// start; Reload records the later ones).
func (s *Stats) PlansLoaded(t time.Time) { s.plansLoaded.Store(t.UnixNano()) }

// PlansLoadedAt returns when the plans in force were loaded; the zero time
// before the first load.
func (s *Stats) PlansLoadedAt() time.Time {
	n := s.plansLoaded.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// Reload records the outcome of one plans reload.
func (s *Stats) Reload(ok bool) {
	s.reloadRefused.Store(!ok)
	if ok {
		s.ReloadOK.Inc()
		s.PlansLoaded(time.Now())
	} else {
		s.ReloadFailed.Inc()
	}
}

// ObserveBatch records the size of one pipeline.
func (s *Stats) ObserveBatch(n int) { s.Batch.Update(float64(n)) }

// WritePrometheus writes these metrics, then the process and Go runtime
// metrics, in the Prometheus text format.
func (s *Stats) WritePrometheus(w io.Writer) {
	s.set.WritePrometheus(w)
	metrics.WriteProcessMetrics(w)
}
