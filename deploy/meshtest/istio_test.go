package meshtest

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	istioextensions "istio.io/api/extensions/v1alpha1"
	meshconfig "istio.io/api/mesh/v1alpha1"
	istionetworking "istio.io/api/networking/v1alpha3"
	extensionsv1alpha1 "istio.io/client-go/pkg/apis/extensions/v1alpha1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/edgelimit/edgelimit/deploy/podspec"
)

const istioDir = "../mesh/istio"

// istioExample is deploy/mesh/istio, decoded.
type istioExample struct {
	wasmPlugins      map[string]*extensionsv1alpha1.WasmPlugin
	serviceEntries   map[string]*networkingv1.ServiceEntry
	destinationRules map[string]*networkingv1.DestinationRule
	gateways         map[string]*networkingv1.Gateway
	virtualServices  map[string]*networkingv1.VirtualService
	deployments      map[string]*appsv1.Deployment
	services         map[string]*corev1.Service
	serviceAccounts  map[string]*corev1.ServiceAccount
	configMaps       map[string]*corev1.ConfigMap
	secrets          map[string]*corev1.Secret
	namespaces       map[string]bool
}

func loadIstio(t *testing.T) *istioExample {
	t.Helper()
	x := &istioExample{
		wasmPlugins: map[string]*extensionsv1alpha1.WasmPlugin{}, serviceEntries: map[string]*networkingv1.ServiceEntry{},
		destinationRules: map[string]*networkingv1.DestinationRule{}, gateways: map[string]*networkingv1.Gateway{},
		virtualServices: map[string]*networkingv1.VirtualService{}, deployments: map[string]*appsv1.Deployment{},
		services: map[string]*corev1.Service{}, serviceAccounts: map[string]*corev1.ServiceAccount{},
		configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}, namespaces: map[string]bool{},
	}
	for _, d := range readDocs(t, istioDir) {
		var ns string
		switch d.apiVersion + " " + d.kind {
		case "extensions.istio.io/v1alpha1 WasmPlugin":
			o := &extensionsv1alpha1.WasmPlugin{}
			decodeIstio(t, d, &o.TypeMeta, &o.ObjectMeta, &o.Spec)
			x.wasmPlugins[o.Name], ns = o, o.Namespace
		case "networking.istio.io/v1 ServiceEntry":
			o := &networkingv1.ServiceEntry{}
			decodeIstio(t, d, &o.TypeMeta, &o.ObjectMeta, &o.Spec)
			x.serviceEntries[o.Name], ns = o, o.Namespace
		case "networking.istio.io/v1 DestinationRule":
			o := &networkingv1.DestinationRule{}
			decodeIstio(t, d, &o.TypeMeta, &o.ObjectMeta, &o.Spec)
			x.destinationRules[o.Name], ns = o, o.Namespace
		case "networking.istio.io/v1 Gateway":
			o := &networkingv1.Gateway{}
			decodeIstio(t, d, &o.TypeMeta, &o.ObjectMeta, &o.Spec)
			x.gateways[o.Name], ns = o, o.Namespace
		case "networking.istio.io/v1 VirtualService":
			o := &networkingv1.VirtualService{}
			decodeIstio(t, d, &o.TypeMeta, &o.ObjectMeta, &o.Spec)
			x.virtualServices[o.Name], ns = o, o.Namespace
		case "apps/v1 Deployment":
			o := &appsv1.Deployment{}
			decode(t, d, o)
			x.deployments[o.Name], ns = o, o.Namespace
		case "v1 Service":
			o := &corev1.Service{}
			decode(t, d, o)
			x.services[o.Name], ns = o, o.Namespace
		case "v1 ServiceAccount":
			o := &corev1.ServiceAccount{}
			decode(t, d, o)
			x.serviceAccounts[o.Name], ns = o, o.Namespace
		case "v1 ConfigMap":
			o := &corev1.ConfigMap{}
			decode(t, d, o)
			x.configMaps[o.Name], ns = o, o.Namespace
		case "v1 Secret":
			o := &corev1.Secret{}
			decode(t, d, o)
			x.secrets[o.Name], ns = o, o.Namespace
		default:
			t.Fatalf("%s: not a kind this test knows", d)
		}
		if ns == "" {
			t.Errorf("%s: no namespace", d)
		}
		x.namespaces[ns] = true
	}
	return x
}

func one[T any](t *testing.T, what string, m map[string]*T) *T {
	t.Helper()
	if len(m) != 1 {
		t.Fatalf("want one %s, have %d", what, len(m))
	}
	for _, v := range m {
		return v
	}
	return nil
}

// TestIstio: the WasmPlugin at the ingress gateway, the ServiceEntry that
// gives its callout a cluster on the pod's loopback, and the gateway pod
// with the sidecar beside istio-proxy.
func TestIstio(t *testing.T) {
	x := loadIstio(t)
	if len(x.namespaces) != 1 {
		t.Errorf("objects in several namespaces %v: the WasmPlugin, the ServiceEntry and the gateway must share one", x.namespaces)
	}
	wp := one(t, "WasmPlugin", x.wasmPlugins)
	se := one(t, "ServiceEntry", x.serviceEntries)
	dr := one(t, "DestinationRule", x.destinationRules)
	dep := one(t, "Deployment", x.deployments)
	pod := &dep.Spec.Template
	proxy := podspec.Container(t, &pod.Spec, "istio-proxy")
	sidecar := podspec.Container(t, &pod.Spec, "edgelimit-sidecar")

	// The module: the image, fail open, on the gateway's pods.
	if !strings.HasPrefix(wp.Spec.Url, "oci://") {
		t.Errorf("WasmPlugin url %q is not an oci:// image", wp.Spec.Url)
	}
	checkImageRef(t, "WasmPlugin url", strings.TrimPrefix(wp.Spec.Url, "oci://"))
	if wp.Spec.FailStrategy != istioextensions.FailStrategy_FAIL_OPEN {
		t.Errorf("WasmPlugin failStrategy %v, want FAIL_OPEN", wp.Spec.FailStrategy)
	}
	if wp.Spec.Type != istioextensions.PluginType_HTTP {
		t.Errorf("WasmPlugin type %v, want HTTP", wp.Spec.Type)
	}
	if wp.Spec.Selector == nil || !selects(wp.Spec.Selector.MatchLabels, pod.Labels) {
		t.Errorf("WasmPlugin selector %v does not select the gateway's pods %v", wp.Spec.Selector, pod.Labels)
	}
	for _, m := range wp.Spec.Match {
		if m.Mode.String() == "SERVER" {
			t.Error("WasmPlugin match mode SERVER: a gateway's traffic is CLIENT")
		}
	}

	// The configuration, as Istio hands it to the module: the struct as
	// JSON (a StringValue).
	cfgJSON, err := protojson.Marshal(wp.Spec.PluginConfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filterConfig(t, "istio", cfgJSON)

	// The callout's cluster is the ServiceEntry's: outbound|PORT||HOST,
	// its one endpoint the pod's loopback where the sidecar listens.
	if len(se.Spec.Hosts) != 1 || len(se.Spec.Ports) != 1 {
		t.Fatalf("ServiceEntry hosts %v ports %v: want one of each", se.Spec.Hosts, se.Spec.Ports)
	}
	host, port := se.Spec.Hosts[0], se.Spec.Ports[0]
	cluster := fmt.Sprintf("outbound|%d||%s", port.Number, host)
	if cfg["sidecar_cluster"] != cluster {
		t.Errorf("sidecar_cluster %v, the ServiceEntry's cluster is %s", cfg["sidecar_cluster"], cluster)
	}
	if cfg["sidecar_authority"] != host {
		t.Errorf("sidecar_authority %v, want the ServiceEntry host %s", cfg["sidecar_authority"], host)
	}
	if se.Spec.Resolution != istionetworking.ServiceEntry_STATIC || len(se.Spec.Endpoints) != 1 {
		t.Errorf("ServiceEntry resolution %v endpoints %v: want STATIC with one endpoint", se.Spec.Resolution, se.Spec.Endpoints)
	}
	if port.Protocol != "HTTP" {
		t.Errorf("ServiceEntry port protocol %q: the callout is HTTP/1.1", port.Protocol)
	}
	if !slices.Equal(se.Spec.ExportTo, []string{"."}) {
		t.Errorf("ServiceEntry exportTo %v: want [.], a loopback endpoint means nothing to other namespaces' proxies", se.Spec.ExportTo)
	}
	listenHost, listenPort := listenAddr(t, sidecar)
	ep := se.Spec.Endpoints[0]
	if ep.Address != "127.0.0.1" || listenHost != ep.Address {
		t.Errorf("ServiceEntry endpoint %s, sidecar -listen host %s: want both 127.0.0.1", ep.Address, listenHost)
	}
	// The endpoint's port is the service port unless the endpoint maps it.
	target := int(port.Number)
	if p, ok := ep.Ports[port.Name]; ok {
		target = int(p)
	}
	if target != listenPort {
		t.Errorf("ServiceEntry sends to port %d, the sidecar listens on %d", target, listenPort)
	}
	if dr.Spec.Host != host || dr.Spec.TrafficPolicy.GetTls().GetMode() != istionetworking.ClientTLSSettings_DISABLE {
		t.Errorf("DestinationRule %s tls %v: want plain HTTP to %s", dr.Spec.Host, dr.Spec.TrafficPolicy.GetTls(), host)
	}
	// The callout cluster's limits are envoy.yaml's ratelimit_sidecar's,
	// not Istio's default (circuit breakers at 2^32-1, connect timeout
	// 10 s): an overflow fails open at once, and the gateway opens no more
	// connections to the sidecar than the chart's Envoy would.
	pool := dr.Spec.TrafficPolicy.GetConnectionPool()
	shipped := shippedSidecarCluster(t)
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"tcp.maxConnections", pool.GetTcp().GetMaxConnections(), int32(shipped.maxConnections)},
		{"http.http1MaxPendingRequests", pool.GetHttp().GetHttp1MaxPendingRequests(), int32(shipped.maxPending)},
		{"http.http2MaxRequests", pool.GetHttp().GetHttp2MaxRequests(), int32(shipped.maxRequests)},
		{"tcp.connectTimeout", pool.GetTcp().GetConnectTimeout().AsDuration(), shipped.connectTimeout},
	} {
		if c.got != c.want {
			t.Errorf("DestinationRule connectionPool %s %v, envoy.yaml's ratelimit_sidecar has %v", c.what, c.got, c.want)
		}
	}

	// The gateway pod: Istio's gateway injection (no traffic redirection)
	// fills in istio-proxy.
	if pod.Annotations["inject.istio.io/templates"] != "gateway" || pod.Labels["sidecar.istio.io/inject"] != "true" {
		t.Errorf("pod annotations %v labels %v: want gateway injection", pod.Annotations, pod.Labels)
	}
	if proxy.Image != "auto" {
		t.Errorf("istio-proxy image %q, want auto (filled in by injection)", proxy.Image)
	}
	if sa := pod.Spec.ServiceAccountName; x.serviceAccounts[sa] == nil {
		t.Errorf("pod service account %q is not in the example", sa)
	}
	gw := one(t, "Gateway", x.gateways)
	if !selects(gw.Spec.Selector, pod.Labels) {
		t.Errorf("Gateway selector %v does not select the gateway's pods", gw.Spec.Selector)
	}
	svc := one(t, "Service", x.services)
	if !selects(svc.Spec.Selector, pod.Labels) {
		t.Errorf("Service selector %v does not select the gateway's pods", svc.Spec.Selector)
	}
	for _, sp := range svc.Spec.Ports {
		target := podspec.Port(t, proxy, sp.TargetPort)
		served := false
		for _, s := range gw.Spec.Servers {
			served = served || int(s.Port.GetNumber()) == target
		}
		if !served {
			t.Errorf("Service port %d goes to %d, where the Gateway has no server", sp.Port, target)
		}
	}
	for _, vs := range x.virtualServices {
		if !slices.Contains(vs.Spec.Gateways, gw.Name) {
			t.Errorf("VirtualService %s is not bound to the Gateway %s", vs.Name, gw.Name)
		}
		// No retries, as envoy.yaml has none: the filter charges a request
		// once. Without retries, Istio gives the route the mesh's
		// defaultHttpRetryPolicy or its own 2 retries on connect-failure,
		// refused-stream, unavailable and cancelled (istio/istio
		// pilot/pkg/networking/core/route/retry/retry.go); attempts 0
		// gives it none.
		for i, r := range vs.Spec.Http {
			if r.GetRetries() == nil || r.GetRetries().GetAttempts() > 0 {
				t.Errorf("VirtualService %s http[%d] retries %v: want attempts 0, or a request charged once reaches the service up to 1 + attempts times", vs.Name, i, r.GetRetries())
			}
		}
	}

	checkSidecar(t, sidecarSetup{pod: &pod.Spec, container: sidecar, configMaps: x.configMaps, secrets: x.secrets})
}

// TestIstioEdgeProtections: the gateway's connection manager does what
// envoy/envoy.yaml's does against hostile clients. Istio's gateway
// (istio/istio pilot/pkg/networking/core gateway.go and
// listener_builder.go, as of master on 2026-08-22, after the 1.31 branch)
// already sets use_remote_address, normalize_path
// (meshConfig.pathNormalization BASE) and proxy_100_continue (istiod's
// ENABLE_100_CONTINUE_HEADERS, true since 1.23) and refuses HTTP/1.0
// unless asked; the rest come from the pod's proxy.istio.io/config, a
// ProxyConfig whose connectionSettings (Istio 1.31 and later) override the
// mesh's on this gateway only.
func TestIstioEdgeProtections(t *testing.T) {
	shipped := checkShippedEdgeHCM(t)
	x := loadIstio(t)
	pod := &one(t, "Deployment", x.deployments).Spec.Template
	proxy := podspec.Container(t, &pod.Spec, "istio-proxy")

	text, ok := pod.Annotations["proxy.istio.io/config"]
	if !ok {
		t.Fatal("the gateway pod has no proxy.istio.io/config: Istio's defaults let x_api_key through, merge no slashes, keep %2F and never time an idle stream out")
	}
	pc := &meshconfig.ProxyConfig{}
	decodeProto(t, "gateway.yaml: proxy.istio.io/config", "proxyConfig", toJSON(t, "proxy.istio.io/config", []byte(text)), pc)
	cs := pc.GetConnectionSettings()
	if got, want := cs.GetHttpHeadersWithUnderscoresAction().String(), "HEADERS_WITH_UNDERSCORES_"+shipped.underscoresAction; got != want {
		t.Errorf("connectionSettings.httpHeadersWithUnderscoresAction %s, envoy.yaml's is %s", got, want)
	}
	if m := cs.GetHttpMergeSlashes(); m == nil || m.GetValue() != shipped.mergeSlashes {
		t.Errorf("connectionSettings.httpMergeSlashes %v, envoy.yaml's merge_slashes is %v (Istio's BASE normalization merges none)", m, shipped.mergeSlashes)
	}
	if got := cs.GetHttpPathWithEscapedSlashesAction().String(); got != shipped.escapedSlashesAction {
		t.Errorf("connectionSettings.httpPathWithEscapedSlashesAction %s, envoy.yaml's is %s", got, shipped.escapedSlashesAction)
	}
	if d := cs.GetHttpStreamIdleTimeout(); d == nil || d.AsDuration() != shipped.streamIdleTimeout {
		t.Errorf("connectionSettings.httpStreamIdleTimeout %v, envoy.yaml's stream_idle_timeout is %v (Istio's default is none)", d, shipped.streamIdleTimeout)
	}
	// Istio sets no http2_protocol_options on a gateway: without these,
	// Envoy's defaults let one connection hold 1024 streams (2^31-1
	// before Envoy 1.36), each a callout, as many as the sidecar cluster
	// takes at once.
	for _, f := range []struct {
		name      string
		got       int32
		want      uint32
		envoyName string
	}{
		{"httpMaxConcurrentStreams", cs.GetHttpMaxConcurrentStreams().GetValue(), shipped.h2MaxConcurrentStreams, "max_concurrent_streams"},
		{"http2InitialStreamWindowSize", cs.GetHttp2InitialStreamWindowSize().GetValue(), shipped.h2StreamWindow, "initial_stream_window_size"},
		{"http2InitialConnectionWindowSize", cs.GetHttp2InitialConnectionWindowSize().GetValue(), shipped.h2ConnectionWindow, "initial_connection_window_size"},
	} {
		if f.got < 0 || uint32(f.got) != f.want {
			t.Errorf("connectionSettings.%s %d, envoy.yaml's %s is %d", f.name, f.got, f.envoyName, f.want)
		}
	}
	if pc.GetProxyMetadata()["EVENT_PRECISE_TIMER"] == "" {
		t.Errorf("proxyMetadata %v has no EVENT_PRECISE_TIMER: Envoy's timers, the callout's timeout among them, run on the kernel's coarse clock", pc.GetProxyMetadata())
	}

	// HTTP/1.0 stays refused: Istio accepts it at a gateway only with
	// ISTIO_META_HTTP10=1 in the proxy's environment (or PILOT_HTTP10 on
	// istiod, not part of the example).
	for _, e := range proxy.Env {
		if e.Name == "ISTIO_META_HTTP10" {
			t.Errorf("istio-proxy env ISTIO_META_HTTP10 %q: envoy.yaml refuses HTTP/1.0", e.Value)
		}
	}
	if _, ok := pc.GetProxyMetadata()["ISTIO_META_HTTP10"]; ok {
		t.Error("proxyMetadata ISTIO_META_HTTP10: envoy.yaml refuses HTTP/1.0")
	}
	// The client is the peer of the connection, as in envoy.yaml: no
	// x-forwarded-for hop is trusted.
	if pc.GetGatewayTopology().GetNumTrustedProxies() != 0 {
		t.Errorf("gatewayTopology.numTrustedProxies %d: envoy.yaml trusts no x-forwarded-for", pc.GetGatewayTopology().GetNumTrustedProxies())
	}
}
