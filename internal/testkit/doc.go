// Package testkit is test support shared by the tests, the end-to-end
// harness and the benchmarks: one poller for conditions that become true
// (Poll and PollErr for tests, Until and Wait for code that returns
// errors), one reader of the Prometheus text format
// (ParseMetrics, GetMetrics), one HTTP round trip that fails the test on an
// error (Do, Get), one server of raw answers (RawServer), an address that
// refuses connections for as long as the test runs (RefusedAddr), a
// load of workers that run until stopped (StartLoad), one reader of
// /proc's stat files (ProcStatFields, ThreadStatFields) and of whether a
// process is stopped (ThreadsStopped), and whether the race detector is on
// (Race).
//
// The product — the filter, the sidecar's non-test code, the Lua script —
// never imports it.
package testkit
