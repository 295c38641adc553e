package main

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
	"github.com/edgelimit/edgelimit/internal/testkit"
)

// envoy.yaml's stats listener serves the admin's /stats/prometheus and
// /ready, without the filter, and answers 404 to everything else, the
// admin's other endpoints included. The admin is on a port the test picked
// (-admin 127.0.0.1:0): the envoy_admin cluster follows it.
func TestStatsListener(t *testing.T) {
	filter, _ := modules(t)
	orders := newService(t, "orders", 0)
	sidecar := newSidecar(t)
	g := start(t, "-config", envoyYAML, "-wasm", filter,
		"-cluster", "orders="+orders.Listener.Addr().String(),
		"-cluster", "billing="+testkit.RefusedAddr(t),
		"-cluster", "ratelimit_sidecar="+sidecar.Listener.Addr().String())
	if g.stats == "" || g.stats == g.admin || g.stats == g.addr {
		t.Fatalf("stats listener %q (listener %s, admin %s)", g.stats, g.addr, g.admin)
	}
	decidedFirst(t, "http://"+g.addr+"/orders/0") // one allowed
	if resp, _ := testkit.Get(t, "http://"+g.addr+"/orders/1", "x-api-key", "alice"); resp.StatusCode != 200 {
		t.Fatalf("through the filter: %d", resp.StatusCode)
	}
	missingKey := stat(t, g.admin, "wasmcustom.edgelimit.requests.missing_key")

	base := "http://" + g.stats
	for _, path := range []string{"/stats/prometheus", "/stats/prometheus?usedonly"} {
		resp, body := testkit.Get(t, base+path)
		if resp.StatusCode != 200 || !strings.Contains(body, "# TYPE edgelimit_requests counter\n"+`edgelimit_requests{decision="allowed"} 2`+"\n") {
			t.Errorf("GET %s: %d, want 200 with the admin's Prometheus text:\n%s", path, resp.StatusCode, body)
		}
		if ct := resp.Header.Get("content-type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
			t.Errorf("GET %s: content-type %q, the admin's", path, ct)
		}
		if resp.Header.Get("x-envoy-upstream-service-time") == "" {
			t.Errorf("GET %s: not routed (no x-envoy-upstream-service-time): %v", path, resp.Header)
		}
	}
	if resp, body := testkit.Get(t, base+"/ready"); resp.StatusCode != 200 || body != "LIVE\n" {
		t.Errorf("GET /ready: %d %q, want 200 LIVE", resp.StatusCode, body)
	}
	for _, path := range []string{"/stats", "/stats/prometheusx", "/ready/", "/config_dump", "/reload", "/", "/orders/1"} {
		resp, body := testkit.Get(t, base+path)
		if resp.StatusCode != 404 || body != "" || resp.Header.Get("server") != "envoy" {
			t.Errorf("GET %s: %d %q (server %q), want the listener's own empty 404", path, resp.StatusCode, body, resp.Header.Get("server"))
		}
	}
	resp, err := http.Post(base+"/reload", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("POST /reload through the stats listener: %d, want 404", resp.StatusCode)
	}
	if n := stat(t, g.admin, statGeneration); n != 1 {
		t.Errorf("%s = %d after POST /reload on the stats listener, want 1 (no reload)", statGeneration, n)
	}
	// Scrapes and probes do not pass the filter: a request without a key
	// was not counted as one.
	if n := stat(t, g.admin, "wasmcustom.edgelimit.requests.missing_key"); n != missingKey {
		t.Errorf("missing_key went from %d to %d: the stats listener ran the filter", missingKey, n)
	}
	if n := stat(t, g.admin, "http.stats.downstream_rq_total"); n != 11 {
		t.Errorf("http.stats.downstream_rq_total = %d, want 11", n)
	}
	if n := stat(t, g.admin, "http.stats.downstream_rq_4xx"); n != 8 {
		t.Errorf("http.stats.downstream_rq_4xx = %d, want 8", n)
	}
	if n := stat(t, g.admin, "cluster.envoy_admin.upstream_rq_total"); n != 3 {
		t.Errorf("cluster.envoy_admin.upstream_rq_total = %d, want 3", n)
	}
}

// A direct_response route on the filter's listener is answered after the
// filter admitted the request, and the filter sees the reply as it sees a
// service's.
func TestDirectResponseThroughTheFilter(t *testing.T) {
	filter, _ := modules(t)
	cfg := shippedWith(t, "              - match: {prefix: /billing}\n", `              - match: {path: /hello}
                direct_response: {status: 200, body: {inline_string: "hello\n"}}
              - match: {prefix: /billing}
`)
	orders := newService(t, "orders", 0)
	sidecar := newSidecar(t)
	g := start(t, "-config", cfg, "-wasm", filter,
		"-cluster", "orders="+orders.Listener.Addr().String(),
		"-cluster", "billing="+testkit.RefusedAddr(t),
		"-cluster", "ratelimit_sidecar="+sidecar.Listener.Addr().String())
	decidedFirst(t, "http://"+g.addr+"/orders/0")
	resp, body := testkit.Get(t, "http://"+g.addr+"/hello?x=1", "x-api-key", "alice")
	if resp.StatusCode != 200 || body != "hello\n" || resp.Header.Get("content-type") != "text/plain" {
		t.Errorf("GET /hello: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if resp.Header.Get("ratelimit-limit") != "10" {
		t.Errorf("the filter did not see the direct response: headers %v", resp.Header)
	}
	if resp, _ := testkit.Get(t, "http://"+g.addr+"/hello", "x-api-key", "deny-bob"); resp.StatusCode != 429 {
		t.Errorf("GET /hello over the limit: %d, want 429 from the filter", resp.StatusCode)
	}
	if resp, _ := testkit.Get(t, "http://"+g.addr+"/hello/x", "x-api-key", "alice"); resp.StatusCode != 404 {
		t.Errorf("GET /hello/x: %d, want 404 (an exact path)", resp.StatusCode)
	}
}

// A reload that adds, moves or removes a listener without the filter says
// it is not applied.
func TestCheckListeners(t *testing.T) {
	var log bytes.Buffer
	g := &gateway{log: slog.New(slog.NewTextHandler(&log, nil))}
	g.others = []*routerListener{newRouterListener(g, envoyconfig.Listener{Name: "stats", Address: "0.0.0.0:9902", StatPrefix: "stats"}),
		newRouterListener(g, envoyconfig.Listener{Name: "old", Address: "0.0.0.0:9903", StatPrefix: "old"})}
	g.checkListeners(&envoyconfig.Config{Listeners: []envoyconfig.Listener{
		{Name: "stats", Address: "0.0.0.0:9999"}, {Name: "new", Address: "0.0.0.0:9904"}}})
	for _, want := range []string{
		`msg="listener address change not applied: restart the gateway to move the listener" listener=stats address=0.0.0.0:9902 configured=0.0.0.0:9999`,
		`msg="new listener not served: restart the gateway to serve it" listener=new configured=0.0.0.0:9904`,
		`msg="listener removed from the configuration: it answers 404 until the gateway restarts" listener=old`,
	} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, log.String())
		}
	}
	log.Reset()
	g.checkListeners(&envoyconfig.Config{Listeners: []envoyconfig.Listener{{Name: "stats", Address: "0.0.0.0:9902"}, {Name: "old", Address: "0.0.0.0:9903"}}})
	if log.Len() != 0 {
		t.Errorf("an unchanged configuration logged:\n%s", log.String())
	}
}
