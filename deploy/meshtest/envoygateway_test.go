package meshtest

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"google.golang.org/protobuf/encoding/protojson"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/edgelimit/edgelimit/deploy/podspec"
)

const egDir = "../mesh/envoy-gateway"

// egExample is deploy/mesh/envoy-gateway, decoded.
type egExample struct {
	extensionPolicies map[string]*egv1a1.EnvoyExtensionPolicy
	patchPolicies     map[string]*egv1a1.EnvoyPatchPolicy
	clientPolicies    map[string]*egv1a1.ClientTrafficPolicy
	envoyProxies      map[string]*egv1a1.EnvoyProxy
	gateways          map[string]*gwapiv1.Gateway
	routes            map[string]*gwapiv1.HTTPRoute
	deployments       map[string]*appsv1.Deployment
	services          map[string]*corev1.Service
	networkPolicies   map[string]*networkingv1.NetworkPolicy
	pdbs              map[string]*policyv1.PodDisruptionBudget
	configMaps        map[string]*corev1.ConfigMap
	secrets           map[string]*corev1.Secret
}

func loadEG(t *testing.T) *egExample {
	t.Helper()
	x := &egExample{
		extensionPolicies: map[string]*egv1a1.EnvoyExtensionPolicy{}, patchPolicies: map[string]*egv1a1.EnvoyPatchPolicy{},
		clientPolicies: map[string]*egv1a1.ClientTrafficPolicy{}, envoyProxies: map[string]*egv1a1.EnvoyProxy{},
		gateways: map[string]*gwapiv1.Gateway{}, routes: map[string]*gwapiv1.HTTPRoute{},
		deployments: map[string]*appsv1.Deployment{}, services: map[string]*corev1.Service{},
		networkPolicies: map[string]*networkingv1.NetworkPolicy{}, pdbs: map[string]*policyv1.PodDisruptionBudget{},
		configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{},
	}
	for _, d := range readDocs(t, egDir) {
		var meta interface{ GetNamespace() string }
		switch d.apiVersion + " " + d.kind {
		case "gateway.envoyproxy.io/v1alpha1 EnvoyExtensionPolicy":
			o := &egv1a1.EnvoyExtensionPolicy{}
			decode(t, d, o)
			x.extensionPolicies[o.Name], meta = o, o
		case "gateway.envoyproxy.io/v1alpha1 EnvoyPatchPolicy":
			o := &egv1a1.EnvoyPatchPolicy{}
			decode(t, d, o)
			x.patchPolicies[o.Name], meta = o, o
		case "gateway.envoyproxy.io/v1alpha1 ClientTrafficPolicy":
			o := &egv1a1.ClientTrafficPolicy{}
			decode(t, d, o)
			x.clientPolicies[o.Name], meta = o, o
		case "gateway.envoyproxy.io/v1alpha1 EnvoyProxy":
			o := &egv1a1.EnvoyProxy{}
			decode(t, d, o)
			x.envoyProxies[o.Name], meta = o, o
		case "gateway.networking.k8s.io/v1 Gateway":
			o := &gwapiv1.Gateway{}
			decode(t, d, o)
			x.gateways[o.Name], meta = o, o
		case "gateway.networking.k8s.io/v1 HTTPRoute":
			o := &gwapiv1.HTTPRoute{}
			decode(t, d, o)
			x.routes[o.Name], meta = o, o
		case "apps/v1 Deployment":
			o := &appsv1.Deployment{}
			decode(t, d, o)
			x.deployments[o.Name], meta = o, o
		case "v1 Service":
			o := &corev1.Service{}
			decode(t, d, o)
			x.services[o.Name], meta = o, o
		case "networking.k8s.io/v1 NetworkPolicy":
			o := &networkingv1.NetworkPolicy{}
			decode(t, d, o)
			x.networkPolicies[o.Name], meta = o, o
		case "policy/v1 PodDisruptionBudget":
			o := &policyv1.PodDisruptionBudget{}
			decode(t, d, o)
			x.pdbs[o.Name], meta = o, o
		case "v1 ConfigMap":
			o := &corev1.ConfigMap{}
			decode(t, d, o)
			x.configMaps[o.Name], meta = o, o
		case "v1 Secret":
			o := &corev1.Secret{}
			decode(t, d, o)
			x.secrets[o.Name], meta = o, o
		default:
			t.Fatalf("%s: not a kind this test knows", d)
		}
		if meta.GetNamespace() == "" {
			t.Errorf("%s: no namespace", d)
		}
	}
	return x
}

// TestEnvoyGateway: the EnvoyExtensionPolicy with the module from the
// image, the EnvoyPatchPolicy adding the cluster its callout names, and the
// sidecar behind that cluster as a Service.
func TestEnvoyGateway(t *testing.T) {
	x := loadEG(t)
	eep := one(t, "EnvoyExtensionPolicy", x.extensionPolicies)
	epp := one(t, "EnvoyPatchPolicy", x.patchPolicies)
	gw := one(t, "Gateway", x.gateways)
	dep := one(t, "Deployment", x.deployments)
	svc := one(t, "Service", x.services)
	np := one(t, "NetworkPolicy", x.networkPolicies)
	pod := &dep.Spec.Template
	sidecar := podspec.Container(t, &pod.Spec, "sidecar")
	if a := pod.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("sidecar pod automountServiceAccountToken %v: it calls no Kubernetes API, it needs no token", a)
	}

	// Both policies attach to the example's Gateway, from its namespace.
	if len(eep.Spec.TargetRefs) != 1 {
		t.Fatalf("EnvoyExtensionPolicy targetRefs %v: want the Gateway", eep.Spec.TargetRefs)
	}
	for what, ref := range map[string]gwapiv1.LocalPolicyTargetReference{
		"EnvoyExtensionPolicy": eep.Spec.TargetRefs[0].LocalPolicyTargetReference,
		"EnvoyPatchPolicy":     epp.Spec.TargetRef,
	} {
		if ref.Group != gwapiv1.GroupName || ref.Kind != "Gateway" || string(ref.Name) != gw.Name {
			t.Errorf("%s targets %s/%s %s, want the Gateway %s", what, ref.Group, ref.Kind, ref.Name, gw.Name)
		}
	}
	if eep.Namespace != gw.Namespace || epp.Namespace != gw.Namespace {
		t.Errorf("policies in %s and %s, the Gateway in %s: a policy attaches only in its own namespace", eep.Namespace, epp.Namespace, gw.Namespace)
	}
	for _, r := range x.routes {
		if len(r.Spec.ParentRefs) != 1 || string(r.Spec.ParentRefs[0].Name) != gw.Name {
			t.Errorf("HTTPRoute %s parents %v, want the Gateway %s", r.Name, r.Spec.ParentRefs, gw.Name)
		}
	}

	// The module from the image, failing open.
	if len(eep.Spec.Wasm) != 1 {
		t.Fatalf("EnvoyExtensionPolicy wasm: %d extensions, want 1", len(eep.Spec.Wasm))
	}
	w := eep.Spec.Wasm[0]
	if w.Code.Type != egv1a1.ImageWasmCodeSourceType || w.Code.Image == nil {
		t.Fatalf("wasm code %+v: want type Image", w.Code)
	}
	checkImageRef(t, "EnvoyExtensionPolicy image url", w.Code.Image.URL)
	if w.FailOpen == nil || !*w.FailOpen {
		t.Error("wasm failOpen is not true")
	}
	if w.Config == nil {
		t.Fatal("wasm has no config")
	}
	// Envoy Gateway hands config.Raw to the module as its StringValue.
	cfg := filterConfig(t, "envoy-gateway", w.Config.Raw)

	// The cluster the callout names is the one the patch adds, whole.
	name, _ := cfg["sidecar_cluster"].(string)
	var cluster *clusterv3.Cluster
	for i, p := range epp.Spec.JSONPatches {
		if p.Type != egv1a1.ClusterEnvoyResourceType || p.Name != name {
			continue
		}
		what := fmt.Sprintf("EnvoyPatchPolicy jsonPatches[%d]", i)
		if p.Operation.Op != "add" || p.Operation.Path == nil || *p.Operation.Path != "" || p.Operation.JSONPath != nil {
			t.Errorf("%s: op %s path %v: a new cluster is added with op add and an empty path", what, p.Operation.Op, p.Operation.Path)
		}
		if p.Operation.Value == nil {
			t.Fatalf("%s: no value", what)
		}
		// Envoy Gateway decodes the value with protojson and validates it.
		cluster = &clusterv3.Cluster{}
		if err := (protojson.UnmarshalOptions{}).Unmarshal(p.Operation.Value.Raw, cluster); err != nil {
			t.Fatalf("%s: not an Envoy Cluster: %v\n%s", what, err, compactJSON(p.Operation.Value.Raw))
		}
		if err := cluster.ValidateAll(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	if cluster == nil {
		t.Fatalf("sidecar_cluster %q: no EnvoyPatchPolicy patch adds a cluster of that name", name)
	}
	if cluster.Name != name || cluster.GetLoadAssignment().GetClusterName() != name {
		t.Errorf("cluster %q (load assignment %q), the patch and the filter name %q", cluster.Name, cluster.GetLoadAssignment().GetClusterName(), name)
	}
	// The callout cluster's limits are envoy.yaml's ratelimit_sidecar's,
	// written out as there rather than left to Envoy's defaults (0 below:
	// unset).
	shipped := shippedSidecarCluster(t)
	var th *clusterv3.CircuitBreakers_Thresholds
	if ths := cluster.GetCircuitBreakers().GetThresholds(); len(ths) == 1 {
		th = ths[0]
	}
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"circuit_breakers max_connections", th.GetMaxConnections().GetValue(), uint32(shipped.maxConnections)},
		{"circuit_breakers max_pending_requests", th.GetMaxPendingRequests().GetValue(), uint32(shipped.maxPending)},
		{"circuit_breakers max_requests", th.GetMaxRequests().GetValue(), uint32(shipped.maxRequests)},
		{"connect_timeout", cluster.GetConnectTimeout().AsDuration(), shipped.connectTimeout},
	} {
		if c.got != c.want {
			t.Errorf("cluster %s %v, envoy.yaml's ratelimit_sidecar has %v", c.what, c.got, c.want)
		}
	}
	if cluster.GetType() != clusterv3.Cluster_STRICT_DNS {
		t.Errorf("cluster type %v, want STRICT_DNS over the headless Service", cluster.GetType())
	}
	eps := cluster.GetLoadAssignment().GetEndpoints()
	if len(eps) != 1 || len(eps[0].GetLbEndpoints()) != 1 {
		t.Fatalf("cluster endpoints %v: want one, the Service's name", eps)
	}
	sa := eps[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	svcHost := svc.Name + "." + svc.Namespace + ".svc.cluster.local"
	if sa.GetAddress() != svcHost {
		t.Errorf("cluster address %s, the sidecar Service is %s", sa.GetAddress(), svcHost)
	}
	if cfg["sidecar_authority"] != svcHost {
		t.Errorf("sidecar_authority %v, want %s", cfg["sidecar_authority"], svcHost)
	}

	// A leaving sidecar pod is still resolved, and called, until it is out
	// of the Service's endpoints (about 1 s), CoreDNS's cached answer has
	// expired (the record's TTL, 5 s by default) and the cluster has
	// resolved again (its dns_refresh_rate, 5 s by default): its preStop
	// must sleep at least that long, and the grace period must cover the
	// sleep and the sidecar's shutdown bound (10 s, sidecar/main.go).
	refresh := int64(5)
	if r := cluster.GetDnsRefreshRate(); r != nil {
		refresh = int64(r.AsDuration().Seconds() + 0.999)
	}
	if stillResolved := 1 + 5 + refresh; sidecar.Lifecycle == nil || sidecar.Lifecycle.PreStop == nil || sidecar.Lifecycle.PreStop.Sleep == nil ||
		sidecar.Lifecycle.PreStop.Sleep.Seconds < stillResolved {
		t.Errorf("sidecar preStop %+v: want a sleep of at least %d s, the time a leaving pod is still resolved", sidecar.Lifecycle, stillResolved)
	} else if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || *g < sidecar.Lifecycle.PreStop.Sleep.Seconds+10 {
		t.Errorf("terminationGracePeriodSeconds %v: want at least the preStop sleep and the sidecar's 10 s shutdown", g)
	}

	// The Service: headless, selecting the sidecar pods, its port the
	// cluster's and the sidecar's -listen.
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service clusterIP %q, want None: STRICT_DNS then balances over the pods", svc.Spec.ClusterIP)
	}
	if !selects(svc.Spec.Selector, pod.Labels) {
		t.Errorf("Service selector %v does not select the sidecar pods %v", svc.Spec.Selector, pod.Labels)
	}
	listenHost, listenPort := listenAddr(t, sidecar)
	if listenHost != "0.0.0.0" && listenHost != "" {
		t.Errorf("sidecar -listen host %s: the Envoy pods are elsewhere", listenHost)
	}
	found := false
	for _, sp := range svc.Spec.Ports {
		if int(sp.Port) == int(sa.GetPortValue()) {
			found = true
			if p := podspec.Port(t, sidecar, sp.TargetPort); p != listenPort {
				t.Errorf("Service port %d goes to %d, the sidecar listens on %d", sp.Port, p, listenPort)
			}
			// A headless Service's DNS name gives the pods' addresses: the
			// cluster's port must be the container's.
			if int(sp.Port) != listenPort {
				t.Errorf("headless Service port %d differs from the sidecar's %d", sp.Port, listenPort)
			}
		}
	}
	if !found {
		t.Errorf("cluster port %d is not a port of the Service", sa.GetPortValue())
	}

	// Only the Gateway's Envoy pods reach the check port.
	if !selects(np.Spec.PodSelector.MatchLabels, pod.Labels) {
		t.Errorf("NetworkPolicy selects %v, not the sidecar pods", np.Spec.PodSelector.MatchLabels)
	}
	checkOnlyEnvoy(t, np, sidecar, listenPort, gw)
	for _, pdb := range x.pdbs {
		if !selects(pdb.Spec.Selector.MatchLabels, pod.Labels) {
			t.Errorf("PodDisruptionBudget %s does not select the sidecar pods", pdb.Name)
		}
	}

	// EnvoyPatchPolicy is on in the Envoy Gateway configuration.
	var values struct {
		Config struct {
			EnvoyGateway egv1a1.EnvoyGatewaySpec `json:"envoyGateway"`
		} `json:"config"`
	}
	valuesFile := filepath.Join(egDir, "envoy-gateway-values.yaml")
	decodeStrict(t, valuesFile, toJSON(t, valuesFile, readFile(t, valuesFile)), &values)
	if api := values.Config.EnvoyGateway.ExtensionAPIs; api == nil || !api.EnableEnvoyPatchPolicy {
		t.Errorf("%s does not enable EnvoyPatchPolicy", valuesFile)
	}

	checkSidecar(t, sidecarSetup{pod: &pod.Spec, container: sidecar, configMaps: x.configMaps, secrets: x.secrets})
}

// checkOnlyEnvoy: the rule that opens the check port admits only the
// Gateway's Envoy pods (Envoy Gateway's labels), and no rule opens it to
// everyone.
func checkOnlyEnvoy(t *testing.T, np *networkingv1.NetworkPolicy, sidecar *corev1.Container, port int, gw *gwapiv1.Gateway) {
	t.Helper()
	envoy := map[string]string{
		"app.kubernetes.io/name":                         "envoy",
		"app.kubernetes.io/managed-by":                   "envoy-gateway",
		"gateway.envoyproxy.io/owning-gateway-name":      gw.Name,
		"gateway.envoyproxy.io/owning-gateway-namespace": gw.Namespace,
	}
	opened := false
	for i, rule := range np.Spec.Ingress {
		covers := len(rule.Ports) == 0
		for _, p := range rule.Ports {
			covers = covers || p.Port == nil || podspec.Port(t, sidecar, *p.Port) == port
		}
		if !covers {
			continue
		}
		if len(rule.From) == 0 {
			t.Errorf("NetworkPolicy ingress[%d] opens the check port %d to everyone", i, port)
		}
		for _, from := range rule.From {
			if from.PodSelector == nil || !selects(from.PodSelector.MatchLabels, envoy) {
				t.Errorf("NetworkPolicy ingress[%d] admits %+v to the check port, not only the Envoy pods", i, from)
			}
			for k, v := range from.PodSelector.MatchLabels {
				if envoy[k] != v {
					t.Errorf("NetworkPolicy ingress[%d] wants label %s=%s, which Envoy Gateway's pods do not carry", i, k, v)
				}
			}
		}
		opened = true
	}
	if !opened {
		t.Error("no NetworkPolicy rule lets the Envoy pods reach the check port")
	}
}

// TestEnvoyGatewayEdgeProtections: the Gateway's connection manager does
// what envoy/envoy.yaml's does against hostile clients. Envoy Gateway
// v1.9.1 (internal/xds/translator/listener.go, internal/gatewayapi
// listener.go and clienttrafficpolicy.go) sets use_remote_address and
// normalize_path on every listener and refuses HTTP/1.0 unless a
// ClientTrafficPolicy asks for it; the ClientTrafficPolicy here writes out
// the rest, and the EnvoyProxy gives Envoy its environment.
func TestEnvoyGatewayEdgeProtections(t *testing.T) {
	shipped := checkShippedEdgeHCM(t)
	x := loadEG(t)
	gw := one(t, "Gateway", x.gateways)
	ctp := one(t, "ClientTrafficPolicy", x.clientPolicies)

	if len(ctp.Spec.TargetRefs) != 1 || ctp.Spec.TargetRef != nil {
		t.Fatalf("ClientTrafficPolicy targetRefs %v targetRef %v: want the Gateway", ctp.Spec.TargetRefs, ctp.Spec.TargetRef)
	}
	if ref := ctp.Spec.TargetRefs[0]; ref.Group != gwapiv1.GroupName || ref.Kind != "Gateway" || string(ref.Name) != gw.Name || ref.SectionName != nil || ctp.Namespace != gw.Namespace {
		t.Errorf("ClientTrafficPolicy %s/%s targets %+v, want the whole Gateway %s/%s", ctp.Namespace, ctp.Name, ref, gw.Namespace, gw.Name)
	}
	// envoy.yaml's enum names, in Envoy Gateway's spelling.
	underscores := map[string]egv1a1.WithUnderscoresAction{"ALLOW": egv1a1.WithUnderscoresActionAllow,
		"REJECT_REQUEST": egv1a1.WithUnderscoresActionRejectRequest, "DROP_HEADER": egv1a1.WithUnderscoresActionDropHeader}
	escaped := map[string]egv1a1.PathEscapedSlashAction{"KEEP_UNCHANGED": egv1a1.KeepUnchangedAction,
		"REJECT_REQUEST": egv1a1.RejectRequestAction, "UNESCAPE_AND_REDIRECT": egv1a1.UnescapeAndRedirect,
		"UNESCAPE_AND_FORWARD": egv1a1.UnescapeAndForward}
	if h := ctp.Spec.Headers; h == nil || h.WithUnderscoresAction == nil || *h.WithUnderscoresAction != underscores[shipped.underscoresAction] {
		t.Errorf("ClientTrafficPolicy headers.withUnderscoresAction %+v, envoy.yaml's is %s", h, shipped.underscoresAction)
	}
	if p := ctp.Spec.Path; p == nil || p.DisableMergeSlashes == nil || *p.DisableMergeSlashes == shipped.mergeSlashes {
		t.Errorf("ClientTrafficPolicy path.disableMergeSlashes %+v, envoy.yaml's merge_slashes is %v", p, shipped.mergeSlashes)
	}
	if p := ctp.Spec.Path; p == nil || p.EscapedSlashesAction == nil || *p.EscapedSlashesAction != escaped[shipped.escapedSlashesAction] {
		t.Errorf("ClientTrafficPolicy path.escapedSlashesAction %+v, envoy.yaml's is %s", p, shipped.escapedSlashesAction)
	}
	var idle time.Duration
	if to := ctp.Spec.Timeout; to != nil && to.HTTP != nil && to.HTTP.StreamIdleTimeout != nil {
		var err error
		if idle, err = time.ParseDuration(string(*to.HTTP.StreamIdleTimeout)); err != nil {
			t.Fatalf("ClientTrafficPolicy timeout.http.streamIdleTimeout: %v", err)
		}
	}
	if idle != shipped.streamIdleTimeout {
		t.Errorf("ClientTrafficPolicy timeout.http.streamIdleTimeout %v, envoy.yaml's stream_idle_timeout is %v (Envoy's default is 5 min)", idle, shipped.streamIdleTimeout)
	}
	// Written out, as Envoy Gateway's defaults (100, 64 KiB, 1 MiB) are
	// the same today: a change of its defaults does not change this edge.
	if h2 := ctp.Spec.HTTP2; h2 == nil || h2.MaxConcurrentStreams == nil || *h2.MaxConcurrentStreams != shipped.h2MaxConcurrentStreams {
		t.Errorf("ClientTrafficPolicy http2.maxConcurrentStreams %+v, envoy.yaml's max_concurrent_streams is %d", h2, shipped.h2MaxConcurrentStreams)
	}
	for _, f := range []struct {
		name      string
		q         func(*egv1a1.HTTP2Settings) *resource.Quantity
		want      uint32
		envoyName string
	}{
		{"initialStreamWindowSize", func(h *egv1a1.HTTP2Settings) *resource.Quantity { return h.InitialStreamWindowSize }, shipped.h2StreamWindow, "initial_stream_window_size"},
		{"initialConnectionWindowSize", func(h *egv1a1.HTTP2Settings) *resource.Quantity { return h.InitialConnectionWindowSize }, shipped.h2ConnectionWindow, "initial_connection_window_size"},
	} {
		var got int64
		if h2 := ctp.Spec.HTTP2; h2 != nil && f.q(h2) != nil {
			got = f.q(h2).Value()
		}
		if got != int64(f.want) {
			t.Errorf("ClientTrafficPolicy http2.%s %d bytes, envoy.yaml's %s is %d", f.name, got, f.envoyName, f.want)
		}
	}
	if h1 := ctp.Spec.HTTP1; h1 != nil && h1.HTTP10 != nil {
		t.Error("ClientTrafficPolicy http1.http10 accepts HTTP/1.0: envoy.yaml refuses it")
	}
	// Set, it turns use_remote_address off (an original-IP extension or
	// trusted hops decide the client instead).
	if ctp.Spec.ClientIPDetection != nil {
		t.Errorf("ClientTrafficPolicy clientIPDetection %+v: envoy.yaml takes the connection's peer for the client", ctp.Spec.ClientIPDetection)
	}

	// Envoy's environment, through the EnvoyProxy the Gateway names.
	ref := gw.Spec.Infrastructure
	if ref == nil || ref.ParametersRef == nil || ref.ParametersRef.Group != egv1a1.GroupName || ref.ParametersRef.Kind != "EnvoyProxy" {
		t.Fatalf("Gateway infrastructure %+v does not name an EnvoyProxy", ref)
	}
	ep := x.envoyProxies[ref.ParametersRef.Name]
	if ep == nil || ep.Namespace != gw.Namespace {
		t.Fatalf("Gateway parametersRef %s: no EnvoyProxy of that name in %s", ref.ParametersRef.Name, gw.Namespace)
	}
	var c *egv1a1.KubernetesContainerSpec
	if p := ep.Spec.Provider; p != nil && p.Kubernetes != nil && p.Kubernetes.EnvoyDeployment != nil {
		c = p.Kubernetes.EnvoyDeployment.Container
	}
	if c == nil || !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "EVENT_PRECISE_TIMER" && e.Value != "" }) {
		t.Errorf("EnvoyProxy %s: no EVENT_PRECISE_TIMER in the Envoy container's env: Envoy's timers, the callout's timeout among them, run on the kernel's coarse clock", ep.Name)
	}
	// Envoy Gateway v1.9.1's default image, Envoy 1.39.1, takes no client
	// for internal with internal_address_config unset, as Envoy Gateway
	// leaves it, as every Envoy since 1.33 does unless a runtime layer sets
	// explicit_internal_address_config to false.
	if c != nil && (c.Image != nil || c.ImageRepository != nil) {
		t.Errorf("EnvoyProxy %s pins Envoy's image (%v, %v): the README's reading of internal addresses is for the default", ep.Name, c.Image, c.ImageRepository)
	}
}
