// Package filtertest is the rate-limit filter's table of behaviour: the
// cases (Run) describing what the filter must do, the configuration fixtures
// they use and the sidecar's model answer. The cases drive the filter through
// the Host interface only, so that the whole table runs on every host: the
// limiter natively behind an emulated host (package
// filter/filtertest/native), and the compiled filter.wasm in the headless
// Envoy (package e2e/filterwasm). The package holds no host of its own.
// A Host is one plugin in one VM, as Envoy runs it on a worker.
package filtertest

import "time"

// Header is one header as a name/value pair; names are lower-case, as Envoy
// hands them to a plugin.
type Header = [2]string

// Host is a proxy-wasm host with the filter loaded into one VM.
// UnknownCluster is the one cluster name a Host has no cluster of.
const UnknownCluster = "no_such_cluster"

type Host interface {
	// Configure runs proxy_on_vm_start and proxy_on_configure with the
	// plugin configuration; it reports false when the plugin rejects it, as
	// Envoy then rejects the configuration.
	Configure(config string) bool
	// NewStream opens an HTTP stream context.
	NewStream() Stream
	// Metric returns the value of a metric the plugin defined, by the name it
	// gave (without Envoy's "wasmcustom." prefix). Histograms report their
	// sample count.
	Metric(name string) (int64, bool)
	// Logs returns every line the plugin logged so far, oldest first.
	Logs() []string
	// FailNextDispatch makes the next proxy_http_call fail synchronously with
	// INTERNAL_FAILURE, so that no callback will come. A call to
	// UnknownCluster fails with BAD_ARGUMENT, as Envoy's proxy_http_call
	// does for a cluster the proxy does not have; every other cluster name
	// is one the host has.
	FailNextDispatch()
	// Advance moves the host's clock (proxy_get_current_time_nanoseconds)
	// forward by d.
	Advance(d time.Duration)
	// StepWall moves the host's wall clock (proxy_get_current_time_nanoseconds)
	// alone by d, forward or back, as an NTP step on the proxy's host
	// does: Envoy's timers run on its monotonic clock and do not move.
	StepWall(d time.Duration)
	// Tick calls proxy_on_tick on the root context once.
	Tick()
	// TickPeriod returns the period the root context last set with
	// proxy_set_tick_period_milliseconds (0: none).
	TickPeriod() time.Duration
	// RootCallouts returns the HTTP calls the root context made itself,
	// not for a stream, that have not been answered, oldest first.
	RootCallouts() []Callout
	// RespondRootCallouts answers every call RootCallouts returns, as
	// Envoy would deliver it: headers (including ":status"), no body; nil
	// headers deliver a reset.
	RespondRootCallouts(headers []Header)
	// Worker starts another VM of the same plugin in the same proxy
	// process, as Envoy does for each worker thread. The new VM has its own
	// contexts and must be configured on its own; it shares the process's
	// shared data (proxy_get/set_shared_data), clock and metrics: Metric
	// reports process-wide values, the sum over the VMs, as Envoy's stats
	// do.
	Worker() Host
	// AddPlugin starts another plugin configuration in this VM, as Envoy
	// does when a listener update changes only the plugin's configuration:
	// the VM stays, and a second root context is created, started
	// (proxy_on_vm_start) and configured with config beside the first. It
	// reports false when the plugin rejects config. The Host it returns is
	// that plugin: its NewStream, Configure, Tick, TickPeriod,
	// RootCallouts, RespondRootCallouts and Remove act on the new root
	// context; everything else is the VM's (Metric, Logs, Advance,
	// FailNextDispatch, Worker, and Close, which ends the whole VM).
	AddPlugin(config string) (Host, bool)
	// Remove ends this host's plugin as Envoy does once the listener that
	// had it has drained (proxy_on_delete of its root context), leaving the
	// VM and its other plugins running. Its streams must have ended.
	Remove()
	// MetricDefinitions returns how many times the plugin in this VM
	// called proxy_define_metric for name (without "wasmcustom.").
	MetricDefinitions(name string) int
	// Close tears the VM down (proxy_on_done and proxy_on_delete of every
	// root context). Run closes every Host it makes; a second Close does
	// nothing.
	Close()
}

// Stream is one HTTP request through the filter.
type Stream interface {
	// RequestHeaders delivers the request headers with end_of_stream set and
	// reports whether the filter let the request continue at once.
	RequestHeaders(headers []Header) (continued bool)
	// Callout returns the HTTP call the filter dispatched for this stream and
	// that has not been answered yet.
	Callout() (Callout, bool)
	// RespondCallout answers the pending callout as Envoy would deliver it:
	// headers (including ":status") and body; nil headers deliver a reset
	// (a callback with zero headers). It works after Done too: the callout
	// belongs to the root context, which gets the answer even when the
	// stream is gone.
	RespondCallout(headers []Header, body []byte)
	// Continued reports whether the request went on to the upstream.
	Continued() bool
	// LocalReply returns the response the filter sent itself, if any.
	LocalReply() (Reply, bool)
	// UpstreamHeaders returns the request headers as the service receives
	// them (valid once the request continued).
	UpstreamHeaders() []Header
	// ResponseHeaders delivers the upstream's response headers and returns
	// them as the client receives them.
	ResponseHeaders(headers []Header) []Header
	// Done ends the stream: proxy_on_log, proxy_on_done, proxy_on_delete.
	Done()
}

// Callout is an HTTP call the filter dispatched with proxy_http_call.
type Callout struct {
	Cluster   string
	Headers   []Header
	Body      []byte
	TimeoutMs uint32
}

// Reply is a local response sent with proxy_send_local_response.
type Reply struct {
	Status  int
	Headers []Header
	Body    []byte
	Details string
}

// Get returns the first value of name in headers.
func Get(headers []Header, name string) (string, bool) {
	for _, h := range headers {
		if h[0] == name {
			return h[1], true
		}
	}
	return "", false
}
