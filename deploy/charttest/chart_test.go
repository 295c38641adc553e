// Package charttest renders the Helm chart in ../helm/edgelimit with Helm's
// own Go API and decodes every object strictly with the Kubernetes API
// types. It is a module of its own so that the main module does not depend
// on Helm; Helm's command is its tool (go tool helm template ...).
package charttest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"google.golang.org/protobuf/encoding/protojson"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/edgelimit/edgelimit/deploy/charttest/chartrender"
	"github.com/edgelimit/edgelimit/deploy/podspec"
)

const chartDir = "../helm/edgelimit"

// Keys whose digests the test values list; none may appear in a ConfigMap.
// One is a canary client in the "canary clients" case: it is in the
// bootstrap's Secret and nowhere else.
var rawKeys = []string{"client-key-123", "client-key-456"}

// bootstrapSecret is the Secret holding Envoy's bootstrap (release "edge").
const bootstrapSecret = "edge-edgelimit-envoy"

func digest(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// rendered is one release's objects, decoded.
type rendered struct {
	deployment     *appsv1.Deployment
	configMaps     map[string]*corev1.ConfigMap
	secrets        map[string]*corev1.Secret
	services       map[string]*corev1.Service
	pdb            *policyv1.PodDisruptionBudget
	serviceMonitor *monitoringv1.ServiceMonitor
	prometheusRule *monitoringv1.PrometheusRule
	// docs are the manifest's documents as rendered, by "Kind name".
	docs map[string]string
}

// pod is the Deployment's pod template.
func (r *rendered) pod() *corev1.PodSpec { return &r.deployment.Spec.Template.Spec }

// render renders the chart with vals (chartrender.Render: release "edge"
// in namespace "gateway", Kubernetes 1.33), then decodes every object of
// the manifest strictly: an unknown field is an error.
func render(t *testing.T, vals map[string]any) (*rendered, error) {
	t.Helper()
	manifest, err := chartrender.Render(chartDir, vals)
	if errors.Is(err, chartrender.ErrChart) {
		t.Fatal(err)
	}
	if err != nil {
		return nil, err
	}
	out := &rendered{configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}, services: map[string]*corev1.Service{}, docs: map[string]string{}}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(manifest, -1) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var head struct {
			APIVersion, Kind string
			Metadata         struct{ Name string }
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("manifest document: %v\n%s", err, doc)
		}
		out.docs[head.Kind+" "+head.Metadata.Name] = doc
		var obj any
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 Deployment":
			if out.deployment != nil {
				t.Fatal("two Deployments")
			}
			out.deployment = &appsv1.Deployment{}
			obj = out.deployment
		case "v1 ConfigMap":
			obj = &corev1.ConfigMap{}
		case "v1 Secret":
			obj = &corev1.Secret{}
		case "v1 Service":
			obj = &corev1.Service{}
		case "policy/v1 PodDisruptionBudget":
			out.pdb = &policyv1.PodDisruptionBudget{}
			obj = out.pdb
		case "monitoring.coreos.com/v1 ServiceMonitor":
			out.serviceMonitor = &monitoringv1.ServiceMonitor{}
			obj = out.serviceMonitor
		case "monitoring.coreos.com/v1 PrometheusRule":
			out.prometheusRule = &monitoringv1.PrometheusRule{}
			obj = out.prometheusRule
		default:
			t.Fatalf("unexpected object %s %s", head.APIVersion, head.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s: strict decode: %v\n%s", head.Kind, err, doc)
		}
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			out.configMaps[o.Name] = o
		case *corev1.Secret:
			out.secrets[o.Name] = o
		case *corev1.Service:
			out.services[o.Name] = o
		}
	}
	if out.deployment == nil {
		t.Fatal("no Deployment")
	}
	return out, nil
}

// values builds chart values from dotted paths, on top of a plans section
// listing rawKeys by digest.
func values(kv ...any) map[string]any {
	v := map[string]any{
		"plans": map[string]any{
			"default_plan": "free",
			"plans": map[string]any{
				"free": map[string]any{"capacity": 10, "rate": "2/s"},
				"pro":  map[string]any{"capacity": 200, "rate": "6000/min"},
			},
			"clients": map[string]any{digest(rawKeys[0]): "pro", digest(rawKeys[1]): "free"},
		},
	}
	for i := 0; i+1 < len(kv); i += 2 {
		m := v
		parts := strings.Split(kv[i].(string), ".")
		for _, p := range parts[:len(parts)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[p] = next
			}
			m = next
		}
		m[parts[len(parts)-1]] = kv[i+1]
	}
	return v
}

func TestChart(t *testing.T) {
	tests := []struct {
		name string
		vals map[string]any
		// what the case adds to the invariants
		check func(t *testing.T, r *rendered)
	}{
		{"defaults", nil, func(t *testing.T, r *rendered) {
			if r.serviceMonitor != nil || r.prometheusRule != nil {
				t.Error("ServiceMonitor or PrometheusRule rendered by default")
			}
			if len(r.deployment.Spec.Template.Spec.InitContainers) != 1 {
				t.Error("no init container copying filter.wasm")
			}
		}},
		{"digest plans", values(), nil},
		{"image volume, service monitor, existing secret, cluster Redis", values(
			"wasm.source", "imageVolume",
			"serviceMonitor.enabled", true,
			"secrets.existingSecret", "edge-credentials",
			"redis.url", "redis+cluster://r1:6379,r2:6379",
			"envoy.port", 8443, "envoy.statsPort", 19000, "envoy.adminPort", 19001,
			"sidecar.port", 18081, "sidecar.adminPort", 18082,
		), func(t *testing.T, r *rendered) {
			spec := r.deployment.Spec.Template.Spec
			if len(spec.InitContainers) != 0 {
				t.Error("init container with an image volume")
			}
			if len(r.secrets) != 1 || r.secrets[bootstrapSecret] == nil {
				t.Errorf("Secrets %v: want only the bootstrap's beside existingSecret", slices.Sorted(maps.Keys(r.secrets)))
			}
			if r.serviceMonitor == nil || len(r.serviceMonitor.Spec.Endpoints) != 2 {
				t.Fatalf("ServiceMonitor: %+v", r.serviceMonitor)
			}
			metrics := r.services["edge-edgelimit-metrics"]
			if metrics == nil {
				t.Fatal("no metrics Service")
			}
			for k, v := range r.serviceMonitor.Spec.Selector.MatchLabels {
				if metrics.Labels[k] != v {
					t.Errorf("ServiceMonitor selects %s=%s, the metrics Service has %q", k, v, metrics.Labels[k])
				}
			}
			for _, ep := range r.serviceMonitor.Spec.Endpoints {
				if !hasPort(metrics, ep.Port) {
					t.Errorf("ServiceMonitor endpoint port %q not on the metrics Service", ep.Port)
				}
			}
			if podspec.Env(t, podspec.Container(t, r.pod(), "sidecar"), "SIDECAR_REDIS").Value != "redis+cluster://r1:6379,r2:6379" {
				t.Error("Redis URL not passed")
			}
		}},
		{"prometheus rule", values("serviceMonitor.enabled", true, "prometheusRule.enabled", true, "filter.timeout_ms", 10), checkPrometheusRule},
		{"canary clients", values("filter.canary_clients", []any{rawKeys[0]}), func(t *testing.T, r *rendered) {
			// The key reaches the plugin (so checkInvariants' search of
			// the ConfigMaps had it to find), in the bootstrap's Secret.
			if got := filterConfig(t, bootstrap(t, r))["canary_clients"]; !reflect.DeepEqual(got, []any{rawKeys[0]}) {
				t.Errorf("the plugin's canary_clients %v, want [%s]", got, rawKeys[0])
			}
			if !strings.Contains(r.docs["Secret "+bootstrapSecret], rawKeys[0]) {
				t.Errorf("the canary key is not in the Secret %s", bootstrapSecret)
			}
		}},
		{"operator values", values(
			"replicaCount", 3,
			"filter.on_failure", "local", "filter.region", "eu-west-1", "filter.mode", "shadow",
			"filter.breaker", map[string]any{"failures": 3, "min_open_ms": 50, "max_open_ms": 2000},
			"filter.warm_connections", 8,
			"redis.url", "rediss+sentinel://s1:26379,s2:26379/mymaster/0",
			"sidecar.redisTimeout", "3500us", "sidecar.logLevel", "warn", "sidecar.readinessPath", "/readyz",
			"envoy.logLevel", "warning", "service.type", "LoadBalancer", "podDisruptionBudget.maxUnavailable", "50%",
		), func(t *testing.T, r *rendered) {
			if got := filterConfig(t, bootstrap(t, r))["on_failure"]; got != "local" {
				t.Errorf("the plugin's on_failure %v, want local", got)
			}
		}},
		{"secret from values", values("secrets.keySalt", "pepper", "secrets.redisPassword", "hunter2", "plans.clients", map[string]any{}), func(t *testing.T, r *rendered) {
			s := r.secrets["edge-edgelimit-secrets"]
			if s == nil || string(s.Data["key-salt"]) != "pepper" || string(s.Data["redis-password"]) != "hunter2" {
				t.Fatalf("Secret: %+v", s)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := render(t, tt.vals)
			if err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, r)
			if tt.check != nil {
				tt.check(t, r)
			}
		})
	}
}

// checkPrometheusRule: the alerts are on the series the ServiceMonitor
// scrapes (the release's namespace, the metrics Service as the job), each
// says how bad it is and what happened, and the callout alert follows the
// filter's timeout.
func checkPrometheusRule(t *testing.T, r *rendered) {
	pr := r.prometheusRule
	if pr == nil || len(pr.Spec.Groups) != 1 || len(pr.Spec.Groups[0].Rules) == 0 {
		t.Fatalf("PrometheusRule: %+v", pr)
	}
	metrics := r.services["edge-edgelimit-metrics"]
	if metrics == nil || r.serviceMonitor == nil || r.serviceMonitor.Spec.JobLabel != "" {
		t.Fatalf("metrics Service %v, ServiceMonitor %+v: want the Service's name as the job", metrics, r.serviceMonitor)
	}
	want := fmt.Sprintf(`namespace="gateway",job=%q`, metrics.Name)
	selector := regexp.MustCompile(`\{[^{}]*\}`)
	metric := regexp.MustCompile(`\b(edgelimit|sidecar|envoy)_[a-z0-9_]+`)
	for _, rule := range pr.Spec.Groups[0].Rules {
		expr := rule.Expr.String()
		if rule.Alert == "" || expr == "" || rule.Labels["severity"] == "" || rule.Annotations["summary"] == "" || rule.Annotations["description"] == "" {
			t.Errorf("rule %+v: want an alert name, an expression, a severity, a summary and a description", rule)
		}
		if rule.For != nil {
			if _, err := time.ParseDuration(string(*rule.For)); err != nil {
				t.Errorf("%s: for %q: %v", rule.Alert, *rule.For, err)
			}
		}
		sels := selector.FindAllString(expr, -1)
		if len(sels) == 0 {
			t.Errorf("%s: no selector in %s", rule.Alert, expr)
		}
		for _, s := range sels {
			if !strings.Contains(s, want) {
				t.Errorf("%s: selector %s is not the release's series (%s)", rule.Alert, s, want)
			}
		}
		// Every metric named has a selector (it is scoped to the release):
		// it is followed by one, or named inside one (__name__=~).
		spans := selector.FindAllStringIndex(expr, -1)
		for _, m := range metric.FindAllStringIndex(expr, -1) {
			inside := slices.ContainsFunc(spans, func(sp []int) bool { return sp[0] < m[0] && m[1] < sp[1] })
			if !inside && !strings.HasPrefix(expr[m[1]:], "{") {
				t.Errorf("%s: %s without a selector in %s", rule.Alert, expr[m[0]:m[1]], expr)
			}
		}
	}
	starved := false
	for _, rule := range pr.Spec.Groups[0].Rules {
		expr := rule.Expr.String()
		switch rule.Alert {
		case "EdgelimitCalloutSlow":
			if !strings.Contains(expr, "> 8000") {
				t.Errorf("EdgelimitCalloutSlow %q: want 80%% of timeout_ms 10 (8000 µs)", expr)
			}
		case "EdgelimitSidecarStarved":
			starved = true
			if !strings.Contains(expr, "sidecar_check_wait_seconds_bucket") || !strings.Contains(expr, "> 0.001") {
				t.Errorf("EdgelimitSidecarStarved %q: want the read waits' p99 against the default 1 ms", expr)
			}
		}
	}
	if !starved {
		t.Error("no EdgelimitSidecarStarved alert")
	}
}

// TestChartRefuses: values the chart must not render, each failing with a
// message that names the value and never quotes an API key or a password.
func TestChartRefuses(t *testing.T) {
	tests := []struct {
		name string
		vals map[string]any
		want string
	}{
		{"raw API key", values("plans.clients", map[string]any{"client-key-123": "pro"}),
			"plans.clients: every client must be listed by digest"},
		{"digest in capitals", values("plans.clients", map[string]any{strings.ToUpper(digest("k")): "pro"}),
			"plans.clients: every client must be listed by digest"},
		{"sha256 digests with a key salt", values("secrets.keySalt", "pepper"),
			"plans.clients: secrets.keySalt is set, so the sidecar matches hmac-sha256: digests"},
		{"hmac-sha256 digests without a key salt", values("plans.clients", map[string]any{"hmac-sha256:" + strings.TrimPrefix(digest("k"), "sha256:"): "pro"}),
			"plans.clients: no key salt is set, so the sidecar matches sha256: digests"},
		{"wasm source", values("wasm.source", "http"), "at '/wasm/source': value must be one of 'initContainer', 'imageVolume'"},
		{"IP family", values("envoy.ipFamily", "IPv6"), "at '/envoy/ipFamily': value must be one of 'IPv4', 'DualStack'"},
		{"no Redis", values("redis.url", ""), "redis.url is required"},
		// values.schema.json, which Helm checks before rendering: each a
		// value the pods would refuse at start (Envoy stops on the filter's
		// configuration, the sidecar exits on a flag) or a name the chart
		// does not know, which Helm would otherwise ignore.
		{"filter mode", values("filter.mode", "enforcing"), "at '/filter/mode': value must be one of 'enforce', 'shadow', 'off'"},
		{"negative filter timeout", values("filter.timeout_ms", -5), "at '/filter/timeout_ms': minimum: got -5, want 1"},
		{"filter on_failure", values("filter.on_failure", "locale"), "at '/filter/on_failure': value must be one of 'open', 'local'"},
		{"filter field misspelt", values("filter.on_failur", "local"), "at '/filter': additional properties 'on_failur' not allowed"},
		{"another callout cluster", values("filter.sidecar_cluster", "my_sidecar"), "at '/filter/sidecar_cluster': value must be 'ratelimit_sidecar'"},
		{"region the sidecar refuses", values("filter.region", "eu west"), "at '/filter/region'"},
		{"cost rule method", values("filter.costs", []any{map[string]any{"method": "post", "cost": 5}}), "at '/filter/costs/0/method'"},
		{"negative Redis timeout", values("sidecar.redisTimeout", "-1ms"), "at '/sidecar/redisTimeout'"},
		{"zero Redis timeout", values("sidecar.redisTimeout", "0ms"), "at '/sidecar/redisTimeout'"},
		{"Redis timeout without a unit", values("sidecar.redisTimeout", 4), "at '/sidecar/redisTimeout': got number, want string"},
		{"sidecar value misspelt", values("sidecar.redisTimout", "10ms"), "at '/sidecar': additional properties 'redisTimout' not allowed"},
		{"log format", values("sidecar.logFormat", "JSON"), "at '/sidecar/logFormat': value must be one of 'text', 'json'"},
		{"no Envoy workers", values("envoy.concurrency", 0), "at '/envoy/concurrency': minimum: got 0, want 1"},
		{"port not a number", values("envoy.port", "http"), "at '/envoy/port': got string, want integer"},
		{"port out of range", values("sidecar.port", 70000), "at '/sidecar/port': maximum"},
		{"top-level value misspelt", values("replicas", 3), "additional properties 'replicas' not allowed"},
		{"canary clients not a list", values("filter.canary_clients", "client-key-123"), "at '/filter/canary_clients': got string, want array"},
		// Values that must agree with each other, and the Redis URL's form
		// (templates/_helpers.tpl, edgelimit.validate).
		{"port shared", values("sidecar.adminPort", 8081), "sidecar.adminPort and sidecar.port: both are 8081"},
		{"Envoy port shared", values("envoy.statsPort", 10000), "envoy.port and envoy.statsPort: both are 10000"},
		{"route to an unknown cluster", values("envoy.routes", []any{map[string]any{"prefix": "/orders", "cluster": "order"}}),
			`envoy.routes[0].cluster: "order" is none of envoy.clusters (billing, orders)`},
		{"cluster named twice", values("envoy.clusters", []any{
			map[string]any{"name": "orders", "host": "a", "port": 80}, map[string]any{"name": "orders", "host": "b", "port": 80}}),
			`envoy.clusters[1].name: "orders" is already envoy.clusters[0]'s`},
		{"the chart's cluster name", values("envoy.clusters", []any{map[string]any{"name": "envoy_admin", "host": "a", "port": 80}}),
			`envoy.clusters[0].name: "envoy_admin" is the chart's own cluster`},
		{"Redis URL without a scheme", values("redis.url", "default:hunter2@redis:6379"), "redis.url: must start with redis://"},
		{"password in the Redis URL", values("redis.url", "redis://default:hunter2@redis:6379/0"), "redis.url: holds a password"},
		{"salt beside an existing Secret", values("secrets.existingSecret", "edge-credentials", "secrets.keySalt", "pepper"),
			"secrets.keySalt or secrets.redisPassword is set beside secrets.existingSecret"},
		{"password beside an existing Secret", values("secrets.existingSecret", "edge-credentials", "secrets.redisPassword", "hunter2"),
			"secrets.keySalt or secrets.redisPassword is set beside secrets.existingSecret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := render(t, tt.vals)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("render: %v, want an error containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "client-key-123") {
				t.Errorf("the error quotes an API key: %v", err)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("the error quotes a password: %v", err)
			}
		})
	}
}

func checkInvariants(t *testing.T, r *rendered) {
	t.Helper()
	spec := r.deployment.Spec.Template.Spec
	envoy, sidecar := podspec.Container(t, r.pod(), "envoy"), podspec.Container(t, r.pod(), "sidecar")
	boot := bootstrap(t, r)

	// Envoy's timers on libevent's precise clock: on the default coarse one
	// a 5 ms callout timeout fires 4 to 8 ms after the call on a 250 Hz
	// kernel (envoy/README.md, "The callout timeout's clock").
	// libevent asks only whether the variable is there, whatever its value.
	podspec.Env(t, envoy, "EVENT_PRECISE_TIMER")

	// The callout cluster is on loopback, at the sidecar's -listen.
	sidecarHost, sidecarPort := clusterAddr(t, boot, "ratelimit_sidecar")
	if sidecarHost != "127.0.0.1" {
		t.Errorf("ratelimit_sidecar cluster on %s, want 127.0.0.1", sidecarHost)
	}
	if listen := podspec.Arg(t, sidecar, "-listen"); listen != net.JoinHostPort(sidecarHost, strconv.Itoa(sidecarPort)) {
		t.Errorf("sidecar -listen %s, callout cluster %s:%d", listen, sidecarHost, sidecarPort)
	}
	// Envoy's admin is on loopback; the stats listener routes to it.
	admin := dig(t, boot, "admin", "address", "socket_address").(map[string]any)
	if admin["address"] != "127.0.0.1" {
		t.Errorf("Envoy admin on %v, want 127.0.0.1", admin["address"])
	}
	if h, p := clusterAddr(t, boot, "envoy_admin"); h != "127.0.0.1" || float64(p) != admin["port_value"] {
		t.Errorf("envoy_admin cluster %s:%d, admin %v", h, p, admin)
	}
	statsPort := listenerPort(t, boot, "stats")
	statsPaths := checkStatsListener(t, boot)

	// The module is mounted where the bootstrap looks for it.
	wasmFile := dig(t, wasmFilter(t, dig(t, boot, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")),
		"config", "vm_config", "code", "local", "filename").(string)
	wasmDir, file := wasmFile[:strings.LastIndex(wasmFile, "/")], wasmFile[strings.LastIndex(wasmFile, "/")+1:]
	mount := podspec.Mount(t, envoy, "wasm")
	if mount.MountPath != wasmDir {
		t.Errorf("wasm volume mounted on %s, the bootstrap loads %s", mount.MountPath, wasmFile)
	}
	vol := podspec.Volume(t, &spec, "wasm")
	switch {
	case vol.Image != nil:
		if vol.Image.Reference == "" {
			t.Error("image volume without a reference")
		}
		if file != "filter.wasm" {
			t.Errorf("bootstrap loads %s from the image, which holds /filter.wasm", file)
		}
	case vol.EmptyDir != nil:
		if len(spec.InitContainers) != 1 {
			t.Fatal("emptyDir wasm volume and no init container to fill it")
		}
		init := spec.InitContainers[0]
		to := init.Command[len(init.Command)-1]
		if m := podspec.Mount(t, &init, "wasm"); to != m.MountPath+"/"+file {
			t.Errorf("init container copies to %s, volume mounted on %s, bootstrap wants %s", to, m.MountPath, file)
		}
	default:
		t.Errorf("wasm volume is neither an image nor an emptyDir: %+v", vol)
	}

	// Probes hit the admin ports: Envoy's stats listener, the sidecar's
	// admin listener; never the check or edge listeners.
	adminListen := podspec.Arg(t, sidecar, "-admin-listen")
	_, adminPortStr, _ := net.SplitHostPort(adminListen)
	adminPort, _ := strconv.Atoi(adminPortStr)
	for _, c := range []struct {
		c    *corev1.Container
		want int
	}{{envoy, statsPort}, {sidecar, adminPort}} {
		for name, p := range map[string]*corev1.Probe{"readiness": c.c.ReadinessProbe, "liveness": c.c.LivenessProbe} {
			if p == nil {
				t.Errorf("%s: no %s probe", c.c.Name, name)
				continue
			}
			var port intstr.IntOrString
			switch {
			case p.HTTPGet != nil:
				port = p.HTTPGet.Port
			case p.TCPSocket != nil:
				port = p.TCPSocket.Port
			default:
				t.Errorf("%s %s probe is neither httpGet nor tcpSocket", c.c.Name, name)
				continue
			}
			if got := podspec.Port(t, c.c, port); got != c.want {
				t.Errorf("%s %s probe on port %d, want the admin port %d", c.c.Name, name, got, c.want)
			}
		}
	}
	if p := envoy.ReadinessProbe.HTTPGet; p == nil || p.Path != "/ready" || !statsPaths[p.Path] {
		t.Errorf("Envoy readiness probe %+v, want GET /ready, which the stats listener routes to the admin (%v)", p, statsPaths)
	}
	// Prometheus scrapes Envoy on the stats listener, through the metrics
	// Service, at a path it passes to the admin.
	if got := podspec.Port(t, envoy, intstr.FromString("envoy-stats")); got != statsPort {
		t.Errorf("Envoy's envoy-stats port %d, the stats listener is on %d", got, statsPort)
	}
	metrics := r.services["edge-edgelimit-metrics"]
	if metrics == nil || !hasPort(metrics, "envoy-stats") {
		t.Errorf("metrics Service %+v has no envoy-stats port", metrics)
	}
	if sm := r.serviceMonitor; sm != nil {
		for _, ep := range sm.Spec.Endpoints {
			if ep.Port == "envoy-stats" && !statsPaths[ep.Path] {
				t.Errorf("ServiceMonitor scrapes envoy-stats at %q, which the stats listener does not pass on (%v)", ep.Path, statsPaths)
			}
			if ep.Port == "envoy-stats" && ep.Path != "/stats/prometheus" {
				t.Errorf("ServiceMonitor scrapes Envoy at %q, want /stats/prometheus", ep.Path)
			}
		}
	}

	// Envoy's workers: set, not Envoy's default of one per hardware thread
	// of the node (whatever the container's CPU), each with its own wasm VM
	// and its own warm connections to the sidecar, which all fit in the
	// callout cluster's connection limit.
	workers, err := strconv.Atoi(podspec.Arg(t, envoy, "--concurrency"))
	if err != nil || workers < 1 {
		t.Errorf("Envoy --concurrency %q: want a number of workers", podspec.Arg(t, envoy, "--concurrency"))
	}
	warm := 16.0 // filter/README.md: warm_connections' default
	if w, ok := filterConfig(t, boot)["warm_connections"].(float64); ok {
		warm = w
	}
	maxConns := dig(t, cluster(t, boot, "ratelimit_sidecar"), "circuit_breakers", "thresholds", 0, "max_connections").(float64)
	if float64(workers)*warm > maxConns {
		t.Errorf("%d workers x %v warm connections exceed ratelimit_sidecar's max_connections %v", workers, warm, maxConns)
	}

	// Draining: Envoy's preStop fails Envoy's health check (so that /ready
	// answers 503: a drain alone leaves it LIVE), asks the admin to drain,
	// then waits; the sidecar outlives it; the grace period covers both.
	pre := envoy.Lifecycle.PreStop.Exec.Command
	script := pre[len(pre)-1]
	if !strings.Contains(script, fmt.Sprintf("/dev/tcp/127.0.0.1/%v", admin["port_value"])) || !strings.Contains(script, "POST /drain_listeners?graceful") {
		t.Errorf("Envoy preStop does not drain through the admin: %q", script)
	}
	if fail := strings.Index(script, "POST /healthcheck/fail "); fail < 0 || fail > strings.Index(script, "POST /drain_listeners?graceful") {
		t.Errorf("Envoy preStop does not fail the health check before draining (/ready stays 200 through a drain): %q", script)
	}
	drain := regexp.MustCompile(`sleep (\d+)$`).FindStringSubmatch(script)
	if drain == nil {
		t.Fatalf("Envoy preStop does not wait: %q", script)
	}
	drainSecs, _ := strconv.Atoi(drain[1])
	if s := sidecar.Lifecycle.PreStop.Sleep; s == nil || s.Seconds <= int64(drainSecs) {
		t.Errorf("sidecar preStop %+v, want a sleep longer than Envoy's %d s", sidecar.Lifecycle.PreStop, drainSecs)
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g <= int64(drainSecs)+2 {
		t.Errorf("terminationGracePeriodSeconds %v, want more than the drain", g)
	}
	// A container its liveness probe kills runs its preStop as well, within
	// the probe's own grace if it has one, else the pod's: a hung Envoy or
	// sidecar is killed at once, not after the drain's sleep.
	for _, c := range []*corev1.Container{envoy, sidecar} {
		if g := c.LivenessProbe.TerminationGracePeriodSeconds; g == nil || *g >= int64(drainSecs) {
			t.Errorf("%s liveness probe's terminationGracePeriodSeconds %v, want one shorter than the %d s drain", c.Name, g, drainSecs)
		}
	}
	if ru := r.deployment.Spec.Strategy.RollingUpdate; ru == nil || ru.MaxUnavailable.IntValue() != 0 {
		t.Errorf("rolling update %+v, want maxUnavailable 0", ru)
	}
	if r.pdb == nil {
		t.Error("no PodDisruptionBudget")
	}
	// The PodDisruptionBudget, the Services and every topology spread
	// constraint select the Deployment's pods.
	podLabels := labels.Set(r.deployment.Spec.Template.Labels)
	selects := func(what string, sel *metav1.LabelSelector) {
		t.Helper()
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil || s.Empty() || !s.Matches(podLabels) {
			t.Errorf("%s selects %v (%v), not the pods (%v)", what, sel, err, podLabels)
		}
	}
	if r.pdb != nil {
		selects("the PodDisruptionBudget", r.pdb.Spec.Selector)
	}
	selects("the Deployment", r.deployment.Spec.Selector)
	for name, svc := range r.services {
		selects("Service "+name, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector})
	}
	for i, c := range spec.TopologySpreadConstraints {
		selects(fmt.Sprintf("topology spread constraint %d (%s)", i, c.TopologyKey), c.LabelSelector)
	}
	for _, c := range []*corev1.Container{envoy, sidecar} {
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: resources %+v", c.Name, c.Resources)
		}
	}

	// Secrets come from the Secret; the plans from the ConfigMap.
	for _, name := range []string{"SIDECAR_KEY_SALT", "SIDECAR_REDIS_PASSWORD"} {
		if e := podspec.Env(t, sidecar, name); e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Errorf("%s is not from a Secret: %+v", name, e)
		}
	}
	plansVol := podspec.Volume(t, &spec, "plans")
	if plansVol.ConfigMap == nil || r.configMaps[plansVol.ConfigMap.Name] == nil {
		t.Fatalf("plans volume %+v is not a rendered ConfigMap", plansVol)
	}
	if p := podspec.Arg(t, sidecar, "-plans"); p != podspec.Mount(t, sidecar, "plans").MountPath+"/plans.yaml" {
		t.Errorf("-plans %s not in the plans mount", p)
	}
	if _, ok := r.configMaps[plansVol.ConfigMap.Name].Data["plans.yaml"]; !ok {
		t.Error("plans ConfigMap has no plans.yaml")
	}

	// No raw API key in any ConfigMap; none in any object but the
	// bootstrap's Secret (canary_clients, in the filter's configuration).
	for name, cm := range r.configMaps {
		for _, key := range rawKeys {
			for k, v := range cm.Data {
				if strings.Contains(v, key) || strings.Contains(k, key) {
					t.Errorf("ConfigMap %s %s holds the API key %q", name, k, key)
				}
			}
			for k, v := range cm.BinaryData {
				if strings.Contains(string(v), key) || strings.Contains(k, key) {
					t.Errorf("ConfigMap %s %s holds the API key %q", name, k, key)
				}
			}
		}
	}
	for name, doc := range r.docs {
		for _, key := range rawKeys {
			if name != "Secret "+bootstrapSecret && strings.Contains(doc, key) {
				t.Errorf("%s holds the API key %q", name, key)
			}
		}
	}
}

// filterConfig is the plugin's configuration in the bootstrap: the JSON of
// the wasm filter's configuration value.
func filterConfig(t *testing.T, boot map[string]any) map[string]any {
	t.Helper()
	value := dig(t, wasmFilter(t, dig(t, listener(t, boot, "edge"), "filter_chains", 0, "filters", 0, "typed_config")),
		"config", "configuration", "value").(string)
	var cfg map[string]any
	if err := json.Unmarshal([]byte(value), &cfg); err != nil {
		t.Fatalf("filter configuration: %v", err)
	}
	return cfg
}

// checkStatsListener holds the stats listener to what makes it safe on
// every interface: the router is its only HTTP filter (no wasm filter),
// every route is an exact path sent to envoy_admin (checked above to be
// the loopback admin) or a direct response, the paths are read-only ones,
// and the last route answers everything else 404. It returns the paths
// passed to the admin.
func checkStatsListener(t *testing.T, boot map[string]any) map[string]bool {
	t.Helper()
	hcm := dig(t, listener(t, boot, "stats"), "filter_chains", 0, "filters", 0, "typed_config").(map[string]any)
	filters := dig(t, hcm, "http_filters").([]any)
	if len(filters) != 1 || dig(t, filters[0], "typed_config", "@type") != "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" {
		t.Errorf("stats listener HTTP filters %v, want the router only", filters)
	}
	readOnly := map[string]bool{"/stats/prometheus": true, "/ready": true}
	routed := map[string]bool{}
	routes := dig(t, hcm, "route_config", "virtual_hosts", 0, "routes").([]any)
	for i, r := range routes {
		rm := r.(map[string]any)
		match := rm["match"].(map[string]any)
		if action, ok := rm["route"].(map[string]any); ok {
			path, _ := match["path"].(string)
			if action["cluster"] != "envoy_admin" || !readOnly[path] || len(match) != 1 {
				t.Errorf("stats route %d: %v, want an exact read-only path (%v) to envoy_admin", i, rm, readOnly)
			}
			routed[path] = true
			continue
		}
		if _, ok := rm["direct_response"]; !ok {
			t.Errorf("stats route %d: %v, want a route to envoy_admin or a direct response", i, rm)
		}
	}
	last := routes[len(routes)-1].(map[string]any)
	if dig(t, last, "match", "prefix") != "/" || dig(t, last, "direct_response", "status") != 404.0 {
		t.Errorf("last stats route %v, want everything else answered 404", last)
	}
	return routed
}

// TestBootstrapFollowsEnvoyYAML: with the default values, the chart's
// bootstrap is envoy/envoy.yaml but for what the values set (the routes and
// the services' addresses) and where the module is mounted: part by part,
// then as a whole.
func TestBootstrapFollowsEnvoyYAML(t *testing.T) {
	r, err := render(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	chart := bootstrap(t, r)
	raw, err := os.ReadFile("../../envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var shipped map[string]any
	if err := yaml.Unmarshal(raw, &shipped); err != nil {
		t.Fatal(err)
	}
	same := func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			g, _ := yaml.Marshal(got)
			w, _ := yaml.Marshal(want)
			t.Errorf("%s differs from envoy.yaml's\nchart:\n%s\nenvoy.yaml:\n%s", what, g, w)
		}
	}
	same("admin", chart["admin"], shipped["admin"])
	same("stats_config", chart["stats_config"], shipped["stats_config"])
	same("the stats listener", listener(t, chart, "stats"), listener(t, shipped, "stats"))
	for _, name := range []string{"ratelimit_sidecar", "envoy_admin"} {
		same("cluster "+name, cluster(t, chart, name), cluster(t, shipped, name))
	}
	// The services' clusters have the shape of envoy.yaml's first one.
	shape := func(c map[string]any) map[string]any {
		c = maps.Clone(c)
		delete(c, "name")
		delete(c, "load_assignment")
		return c
	}
	same("a service's cluster", shape(cluster(t, chart, "orders")), shape(cluster(t, shipped, "orders")))

	// The edge listener, without its routes, the module's path and the
	// filter's JSON (compared as JSON below).
	edge := func(boot map[string]any) (map[string]any, any) {
		l := runtime.DeepCopyJSON(listener(t, boot, "edge"))
		hcm := dig(t, l, "filter_chains", 0, "filters", 0, "typed_config").(map[string]any)
		delete(dig(t, hcm, "route_config", "virtual_hosts", 0).(map[string]any), "routes")
		cfg := dig(t, wasmFilter(t, hcm), "config").(map[string]any)
		delete(dig(t, cfg, "vm_config", "code", "local").(map[string]any), "filename")
		value := dig(t, cfg, "configuration").(map[string]any)
		var filter any
		if err := json.Unmarshal([]byte(value["value"].(string)), &filter); err != nil {
			t.Fatalf("filter configuration: %v", err)
		}
		delete(value, "value")
		return l, filter
	}
	chartEdge, chartFilter := edge(chart)
	shippedEdge, shippedFilter := edge(shipped)
	same("the edge listener", chartEdge, shippedEdge)
	same("the filter's configuration", chartFilter, shippedFilter)
	same("the services' routes", dig(t, listener(t, chart, "edge"), "filter_chains", 0, "filters", 0, "typed_config", "route_config", "virtual_hosts", 0, "routes"),
		dig(t, listener(t, shipped, "edge"), "filter_chains", 0, "filters", 0, "typed_config", "route_config", "virtual_hosts", 0, "routes"))

	// And the whole of it, so that a setting added to envoy.yaml anywhere
	// (a top-level section, a listener, a cluster) is missed by no
	// comparison above: the documents, but for the services' addresses,
	// the module's path and the filter's JSON (compared as JSON), are the
	// same.
	whole := func(boot map[string]any) map[string]any {
		b := runtime.DeepCopyJSON(boot)
		for _, c := range dig(t, b, "static_resources", "clusters").([]any) {
			if name := c.(map[string]any)["name"]; name != "ratelimit_sidecar" && name != "envoy_admin" {
				delete(c.(map[string]any), "load_assignment")
			}
		}
		cfg := dig(t, wasmFilter(t, dig(t, listener(t, b, "edge"), "filter_chains", 0, "filters", 0, "typed_config")), "config").(map[string]any)
		delete(dig(t, cfg, "vm_config", "code", "local").(map[string]any), "filename")
		delete(dig(t, cfg, "configuration").(map[string]any), "value")
		return b
	}
	for _, d := range diffPaths("", whole(chart), whole(shipped)) {
		t.Errorf("the bootstrap differs from envoy.yaml at %s", d)
	}
}

// diffPaths lists where two generic YAML documents differ: a key in one
// only, a list of another length, a value not the same.
func diffPaths(at string, a, b any) []string {
	switch a := a.(type) {
	case map[string]any:
		bm, ok := b.(map[string]any)
		if !ok {
			return []string{at + ": a mapping in the chart's"}
		}
		var out []string
		for _, k := range slices.Sorted(maps.Keys(a)) {
			if _, ok := bm[k]; !ok {
				out = append(out, at+"."+k+": in the chart's only")
				continue
			}
			out = append(out, diffPaths(at+"."+k, a[k], bm[k])...)
		}
		for _, k := range slices.Sorted(maps.Keys(bm)) {
			if _, ok := a[k]; !ok {
				out = append(out, at+"."+k+": in envoy.yaml's only")
			}
		}
		return out
	case []any:
		bl, ok := b.([]any)
		if !ok || len(a) != len(bl) {
			return []string{fmt.Sprintf("%s: %d items in the chart's, %v in envoy.yaml's", at, len(a), b)}
		}
		var out []string
		for i := range a {
			out = append(out, diffPaths(fmt.Sprintf("%s[%d]", at, i), a[i], bl[i])...)
		}
		return out
	}
	if !reflect.DeepEqual(a, b) {
		return []string{fmt.Sprintf("%s: %v in the chart's, %v in envoy.yaml's", at, a, b)}
	}
	return nil
}

// TestBootstrapChangeRollsPods: Envoy reads its bootstrap only at start, so
// the pod template carries the bootstrap Secret's checksum: a change to the
// filter's configuration rolls the pods, a change to the plans (reloaded in
// place) does not.
func TestBootstrapChangeRollsPods(t *testing.T) {
	checksum := func(vals map[string]any) string {
		t.Helper()
		r, err := render(t, vals)
		if err != nil {
			t.Fatal(err)
		}
		sum := r.deployment.Spec.Template.Annotations["checksum/envoy"]
		if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(sum) {
			t.Fatalf("checksum/envoy %q, want a sha256", sum)
		}
		return sum
	}
	base := checksum(values())
	if canary := checksum(values("filter.canary_clients", []any{rawKeys[0]})); canary == base {
		t.Error("checksum/envoy unchanged by a change to the filter's configuration")
	}
	if plans := checksum(values("plans.default_plan", "pro")); plans != base {
		t.Error("checksum/envoy changed by a change to the plans alone")
	}
}

// TestImageVolumeNeedsKubernetes133: the module as an image volume needs
// Kubernetes 1.33 (the ImageVolume feature gate). On an older cluster the
// API server drops the volume's image source and refuses the Deployment
// with an error about a volume without a type; the chart refuses first,
// naming the value. The init container works on every version the chart
// supports.
func TestImageVolumeNeedsKubernetes133(t *testing.T) {
	_, err := chartrender.RenderFor(chartDir, values("wasm.source", "imageVolume"), "1", "32")
	if want := "wasm.source: imageVolume needs Kubernetes 1.33 or later"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("imageVolume on Kubernetes 1.32: %v, want an error containing %q", err, want)
	}
	for _, v := range []struct{ source, minor string }{{"initContainer", "30"}, {"imageVolume", "33"}, {"imageVolume", "35"}} {
		if _, err := chartrender.RenderFor(chartDir, values("wasm.source", v.source), "1", v.minor); err != nil {
			t.Errorf("%s on Kubernetes 1.%s: %v", v.source, v.minor, err)
		}
	}
}

// TestReplicasSpread: by default the replicas spread over nodes and over
// zones (the PodDisruptionBudget guards evictions only, not a node lost),
// as a preference the scheduler meets where it can, so that a cluster of
// one node still runs them all; an operator's own constraint, with its own
// labelSelector, is kept as given.
func TestReplicasSpread(t *testing.T) {
	r, err := render(t, values())
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for _, c := range r.pod().TopologySpreadConstraints {
		if c.WhenUnsatisfiable != corev1.ScheduleAnyway || c.MaxSkew != 1 {
			t.Errorf("constraint on %s: %s, maxSkew %d; want ScheduleAnyway, 1", c.TopologyKey, c.WhenUnsatisfiable, c.MaxSkew)
		}
		keys[c.TopologyKey] = true
	}
	for _, k := range []string{corev1.LabelHostname, corev1.LabelTopologyZone} {
		if !keys[k] {
			t.Errorf("the replicas are not spread over %s: one node or zone lost can take them all", k)
		}
	}
	own := map[string]any{"maxSkew": 2, "topologyKey": "example.com/rack", "whenUnsatisfiable": "DoNotSchedule",
		"labelSelector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "edgelimit"}}}
	r, err = render(t, values("topologySpreadConstraints", []any{own}))
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, r)
	if c := r.pod().TopologySpreadConstraints; len(c) != 1 || c[0].TopologyKey != "example.com/rack" || len(c[0].LabelSelector.MatchLabels) != 1 {
		t.Errorf("an operator's constraint rendered as %+v", c)
	}
}

// TestSecretsChangeRollsPods: the sidecar reads SIDECAR_KEY_SALT and
// SIDECAR_REDIS_PASSWORD from its environment, set from the Secret only when
// the container starts, while it reloads the plans in place. A new salt with
// the plans' clients digested under it must reach the pods as a new pod
// template (a rollout): else the running sidecars would keep the old salt,
// match none of the new hmac-sha256: digests and give every listed client
// the default plan. So must a new Redis password.
func TestSecretsChangeRollsPods(t *testing.T) {
	template := func(kv ...any) string {
		t.Helper()
		r, err := render(t, values(append([]any{"plans.clients", map[string]any{}}, kv...)...))
		if err != nil {
			t.Fatal(err)
		}
		js, err := json.Marshal(r.deployment.Spec.Template)
		if err != nil {
			t.Fatal(err)
		}
		return string(js)
	}
	base := template("secrets.keySalt", "old-salt", "secrets.redisPassword", "old-password")
	if template("secrets.keySalt", "new-salt", "secrets.redisPassword", "old-password") == base {
		t.Error("the pod template is the same after secrets.keySalt changed: running sidecars keep the old salt")
	}
	if template("secrets.keySalt", "old-salt", "secrets.redisPassword", "new-password") == base {
		t.Error("the pod template is the same after secrets.redisPassword changed: running sidecars keep the old password")
	}
	if template("secrets.keySalt", "old-salt", "secrets.redisPassword", "old-password", "plans.default_plan", "pro") != base {
		t.Error("the pod template changed with the plans alone, which the sidecar reloads in place")
	}
}

// TestListenersFollowIPFamily: Envoy's pod-facing listeners bind 0.0.0.0
// by default (an IPv4 socket, envoy.yaml's), and "::" with ipv4_compat
// (IPv6 and IPv4 clients on one socket) with envoy.ipFamily DualStack, so
// that the Service and the kubelet's probes reach Envoy on an IPv6-only
// cluster. Envoy's admin and the callout cluster stay on 127.0.0.1, which
// every pod's loopback has.
func TestListenersFollowIPFamily(t *testing.T) {
	for _, tt := range []struct {
		family string
		want   map[string]any
	}{
		{"", map[string]any{"address": "0.0.0.0"}},
		{"IPv4", map[string]any{"address": "0.0.0.0"}},
		{"DualStack", map[string]any{"address": "::", "ipv4_compat": true}},
	} {
		var vals map[string]any
		if tt.family != "" {
			vals = values("envoy.ipFamily", tt.family)
		}
		r, err := render(t, vals)
		if err != nil {
			t.Fatal(err)
		}
		boot := bootstrap(t, r)
		for _, l := range []struct {
			name string
			port int
		}{{"edge", 10000}, {"stats", 9902}} {
			want := maps.Clone(tt.want)
			want["port_value"] = l.port
			got := dig(t, listener(t, boot, l.name), "address", "socket_address")
			// As printed: YAML's numbers decode as int64 or float64.
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("ipFamily %q: listener %s socket_address = %v, want %v", tt.family, l.name, got, want)
			}
		}
		if got := dig(t, boot, "admin", "address", "socket_address", "address"); got != "127.0.0.1" {
			t.Errorf("ipFamily %q: admin address %v, want 127.0.0.1", tt.family, got)
		}
	}
}

func listener(t *testing.T, boot map[string]any, name string) map[string]any {
	t.Helper()
	for _, l := range dig(t, boot, "static_resources", "listeners").([]any) {
		if l.(map[string]any)["name"] == name {
			return l.(map[string]any)
		}
	}
	t.Fatalf("no listener %s", name)
	return nil
}

func cluster(t *testing.T, boot map[string]any, name string) map[string]any {
	t.Helper()
	for _, c := range dig(t, boot, "static_resources", "clusters").([]any) {
		if c.(map[string]any)["name"] == name {
			return c.(map[string]any)
		}
	}
	t.Fatalf("no cluster %s", name)
	return nil
}

// bootstrap is Envoy's bootstrap from its Secret (the filter's
// configuration in it may name clients by key), as generic YAML.
func bootstrap(t *testing.T, r *rendered) map[string]any {
	t.Helper()
	vol := podspec.Volume(t, r.pod(), "envoy-config")
	if vol.Secret == nil || vol.Secret.SecretName != bootstrapSecret {
		js, _ := json.Marshal(vol)
		t.Fatalf("envoy-config volume %s, want the Secret %s", js, bootstrapSecret)
	}
	secret := r.secrets[vol.Secret.SecretName]
	if secret == nil {
		t.Fatalf("no Secret %s", vol.Secret.SecretName)
	}
	text, ok := secret.StringData["envoy.yaml"]
	if !ok || len(secret.Data) != 0 || len(secret.StringData) != 1 {
		t.Fatalf("Secret %s: want envoy.yaml as its only stringData, has data %v, stringData %v",
			secret.Name, slices.Sorted(maps.Keys(secret.Data)), slices.Sorted(maps.Keys(secret.StringData)))
	}
	envoy := podspec.Container(t, r.pod(), "envoy")
	if c := podspec.Arg(t, envoy, "-c"); c != podspec.Mount(t, envoy, "envoy-config").MountPath+"/envoy.yaml" {
		t.Fatalf("envoy -c %s is not the mounted bootstrap", c)
	}
	// Decoded with Envoy's own API types (unknown fields and @types are
	// errors) and checked against the field rules of Envoy's protos.
	js, err := yaml.YAMLToJSON([]byte(text))
	if err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	var pb bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &pb); err != nil {
		t.Fatalf("bootstrap rejected by Envoy's API types: %v", err)
	}
	if err := pb.ValidateAll(); err != nil {
		t.Errorf("bootstrap breaks Envoy's field rules: %v", err)
	}
	var boot map[string]any
	if err := yaml.Unmarshal([]byte(text), &boot); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	return boot
}

// dig follows keys (strings) and indexes (ints) into generic YAML.
// wasmFilter is the typed_config of the wasm filter among hcm's
// http_filters (after the CORS filter, when the values render one).
func wasmFilter(t *testing.T, hcm any) map[string]any {
	t.Helper()
	for _, f := range dig(t, hcm, "http_filters").([]any) {
		tc := dig(t, f, "typed_config").(map[string]any)
		if tc["@type"] == "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm" {
			return tc
		}
	}
	t.Fatal("bootstrap: no wasm filter in http_filters")
	return nil
}

func dig(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch p := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok || m[p] == nil {
				t.Fatalf("bootstrap: no %q in %v", p, v)
			}
			v = m[p]
		case int:
			l, ok := v.([]any)
			if !ok || len(l) <= p {
				t.Fatalf("bootstrap: no item %d in %v", p, v)
			}
			v = l[p]
		}
	}
	return v
}

func clusterAddr(t *testing.T, boot map[string]any, name string) (string, int) {
	t.Helper()
	for _, c := range dig(t, boot, "static_resources", "clusters").([]any) {
		if c.(map[string]any)["name"] == name {
			sa := dig(t, c, "load_assignment", "endpoints", 0, "lb_endpoints", 0, "endpoint", "address", "socket_address").(map[string]any)
			return sa["address"].(string), int(sa["port_value"].(float64))
		}
	}
	t.Fatalf("no cluster %s", name)
	return "", 0
}

func listenerPort(t *testing.T, boot map[string]any, name string) int {
	t.Helper()
	return int(dig(t, listener(t, boot, name), "address", "socket_address", "port_value").(float64))
}

func hasPort(s *corev1.Service, name string) bool {
	for _, p := range s.Spec.Ports {
		if p.Name == name {
			return true
		}
	}
	return false
}

// TestImagesFromTheDockerfile: the images the chart runs by default are the
// ones deploy/Dockerfile's header builds and tags, and the init container's
// copy is the filter target's own command, from where that target puts the
// module (the path the image volume is read at, checkInvariants).
func TestImagesFromTheDockerfile(t *testing.T) {
	raw, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	// The header's build commands, continuation lines joined.
	var header []string
	cont := false
	for _, line := range strings.Split(string(raw), "\n") {
		text, ok := strings.CutPrefix(line, "#")
		if !ok {
			break
		}
		text = strings.TrimSpace(text)
		if cont {
			header[len(header)-1] += " " + text
		} else {
			header = append(header, text)
		}
		cont = strings.HasSuffix(text, `\`)
		if cont {
			header[len(header)-1] = strings.TrimSuffix(header[len(header)-1], `\`)
		}
	}
	tags := map[string]string{}
	build := regexp.MustCompile(`^docker (?:buildx )?build -f deploy/Dockerfile (?:--target (\S+) )?.*-t (\S+)`)
	for _, cmd := range header {
		if m := build.FindStringSubmatch(cmd); m != nil {
			target := m[1]
			if target == "" {
				target = "sidecar"
			}
			tags[target] = m[2]
		}
	}
	// The stages: the last is the default target.
	stage := regexp.MustCompile(`(?m)^FROM \S+(?: \S+)* AS (\S+)$`)
	names := stage.FindAllStringSubmatch(string(raw), -1)
	if len(names) == 0 || names[len(names)-1][1] != "sidecar" {
		t.Fatalf("stages %v: want sidecar last, the default target", names)
	}
	filterStage := string(raw)[strings.Index(string(raw), " AS filter\n"):]
	filterStage = filterStage[:strings.Index(filterStage, "\nFROM ")]
	copyTo := regexp.MustCompile(`(?m)^COPY --from=build /out/filter\.wasm (\S+)$`).FindStringSubmatch(filterStage)
	cmd := regexp.MustCompile(`(?m)^CMD (\[.*\])$`).FindStringSubmatch(filterStage)
	if copyTo == nil || cmd == nil {
		t.Fatalf("the filter stage has no COPY of filter.wasm or no CMD:\n%s", filterStage)
	}
	var copyCmd []string
	if err := json.Unmarshal([]byte(cmd[1]), &copyCmd); err != nil || len(copyCmd) != 3 || copyCmd[1] != copyTo[1] {
		t.Fatalf("filter stage CMD %s: want a cp from %s (%v)", cmd[1], copyTo[1], err)
	}
	if copyTo[1] != "/filter.wasm" {
		t.Errorf("the filter image holds %s; the chart reads /filter.wasm from it", copyTo[1])
	}

	r, err := render(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	init := r.deployment.Spec.Template.Spec.InitContainers[0]
	if !reflect.DeepEqual(init.Command, copyCmd) {
		t.Errorf("init container runs %q, the filter target's command is %q", init.Command, copyCmd)
	}
	for target, image := range map[string]string{"filter": init.Image, "sidecar": podspec.Container(t, r.pod(), "sidecar").Image} {
		if tags[target] == "" || image != tags[target] {
			t.Errorf("the chart runs %s for the %s target, the Dockerfile tags it %q", image, target, tags[target])
		}
	}
}

// TestCORSFollowsValues: envoy.cors.allowOrigins lists the origins of the
// CORS filter's policy, each an exact match; an empty list renders neither
// the filter nor its policy.
func TestCORSFollowsValues(t *testing.T) {
	for _, c := range []struct {
		origins []any
		want    []any
	}{
		{[]any{"https://a.example", "http://localhost:3000"},
			[]any{map[string]any{"exact": "https://a.example"}, map[string]any{"exact": "http://localhost:3000"}}},
		{[]any{}, nil},
	} {
		r, err := render(t, map[string]any{"envoy": map[string]any{"cors": map[string]any{"allowOrigins": c.origins}}})
		if err != nil {
			t.Fatal(err)
		}
		hcm := dig(t, listener(t, bootstrap(t, r), "edge"), "filter_chains", 0, "filters", 0, "typed_config")
		vh := dig(t, hcm, "route_config", "virtual_hosts", 0).(map[string]any)
		filters := dig(t, hcm, "http_filters").([]any)
		if c.want == nil {
			if _, ok := vh["typed_per_filter_config"]; ok || len(filters) != 2 {
				t.Errorf("no origins: policy %v, %d filters; want no policy, the wasm filter and the router", vh["typed_per_filter_config"], len(filters))
			}
			continue
		}
		if got := dig(t, vh, "typed_per_filter_config", "envoy.filters.http.cors", "allow_origin_string_match"); !reflect.DeepEqual(got, c.want) {
			t.Errorf("origins %v: allow_origin_string_match %v, want %v", c.origins, got, c.want)
		}
		if got := dig(t, filters[0], "name"); got != "envoy.filters.http.cors" {
			t.Errorf("origins %v: first filter %v, want the CORS filter", c.origins, got)
		}
	}
	if _, err := render(t, map[string]any{"envoy": map[string]any{"cors": map[string]any{"allowOrigins": []any{"app.example.com"}}}}); err == nil {
		t.Error("an origin without a scheme rendered")
	}
}
