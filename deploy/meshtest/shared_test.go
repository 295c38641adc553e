package meshtest

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/edgelimit/edgelimit/deploy/podspec"
)

const repoRoot = "../.."

// The example clients of both plans files, listed there by digest only.
var rawKeys = []string{"client-key-123", "client-key-456"}

func digest(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// documentedFields are the configuration fields filter/README.md's
// Configuration table lists.
func documentedFields(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "filter/README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	start := strings.Index(text, "\n## Configuration\n")
	if start < 0 {
		t.Fatal("filter/README.md: no Configuration section")
	}
	section := text[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	var fields []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|").FindAllStringSubmatch(section, -1) {
		fields = append(fields, m[1])
	}
	if len(fields) < 5 || !slices.Contains(fields, "sidecar_cluster") {
		t.Fatalf("filter/README.md's Configuration table: found only %v", fields)
	}
	return fields
}

// filterConfig checks one example's filter configuration, the JSON its
// mesh hands the module: a JSON object whose every field filter/README.md
// documents, accepted by the filter's own parser (filter/configcheck, run
// in the main module so that this module does not depend on it). It
// returns the object.
func filterConfig(t *testing.T, name string, j []byte) map[string]any {
	t.Helper()
	var cfg map[string]any
	if err := json.Unmarshal(j, &cfg); err != nil {
		t.Fatalf("%s: the filter configuration is not a JSON object: %v\n%s", name, err, j)
	}
	documented := documentedFields(t)
	for k := range cfg {
		if !slices.Contains(documented, k) {
			t.Errorf("%s: filter configuration field %q is not in filter/README.md (%v)", name, k, documented)
		}
	}
	file := filepath.Join(t.TempDir(), name+".json")
	if err := os.WriteFile(file, j, 0o600); err != nil {
		t.Fatal(err)
	}
	// The go command `make mesh` was given, or the one on PATH.
	cmd := exec.Command(cmp.Or(os.Getenv("GO"), "go"), "run", "./filter/configcheck", file)
	cmd.Dir = repoRoot
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), ": ok: ") {
		t.Fatalf("%s: filter/configcheck refuses the configuration (%v):\n%s\n%s", name, err, out, j)
	}
	t.Logf("%s: %s", name, strings.TrimSpace(string(out)))
	return cfg
}

// sidecarSetup is what checkSidecar reads from an example.
type sidecarSetup struct {
	pod        *corev1.PodSpec
	container  *corev1.Container
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
}

// checkSidecar checks the sidecar container the way both examples run it:
// plans from a ConfigMap of the example listing clients by digest only,
// the key salt and Redis password from a Secret of the example, Redis
// external with no password in its URL, probes on the admin listener, a
// preStop wait.
func checkSidecar(t *testing.T, s sidecarSetup) {
	t.Helper()
	c := s.container

	plansVol := podspec.Volume(t, s.pod, "plans")
	if plansVol.ConfigMap == nil || s.configMaps[plansVol.ConfigMap.Name] == nil {
		t.Fatalf("plans volume %+v is not a ConfigMap of the example", plansVol)
	}
	if p, m := podspec.Arg(t, c, "-plans"), podspec.Mount(t, c, "plans").MountPath; p != m+"/plans.yaml" {
		t.Errorf("-plans %s is not plans.yaml in the plans mount %s", p, m)
	}
	plansText, ok := s.configMaps[plansVol.ConfigMap.Name].Data["plans.yaml"]
	if !ok {
		t.Fatal("plans ConfigMap has no plans.yaml")
	}
	var plans struct {
		DefaultPlan string                    `json:"default_plan"`
		Plans       map[string]map[string]any `json:"plans"`
		Clients     map[string]any            `json:"clients"`
	}
	decodeStrict(t, "plans.yaml", toJSON(t, "plans.yaml", []byte(plansText)), &plans)
	digestRE := regexp.MustCompile(`^(sha256|hmac-sha256):[0-9a-f]{64}$`)
	for k, plan := range plans.Clients {
		if !digestRE.MatchString(k) {
			t.Errorf("plans.yaml lists a client by something other than a digest: %.12q…", k)
		}
		name, _ := plan.(string)
		if _, ok := plans.Plans[name]; !ok {
			t.Errorf("plans.yaml: a client's plan %v is not a plan", plan)
		}
	}
	for _, k := range rawKeys {
		if _, ok := plans.Clients[digest(k)]; !ok {
			t.Errorf("plans.yaml does not list the example key %s by its digest", k)
		}
	}
	for name, cm := range s.configMaps {
		for k, v := range cm.Data {
			for _, key := range rawKeys {
				if strings.Contains(v, key) || strings.Contains(k, key) {
					t.Errorf("ConfigMap %s %s holds the API key %q", name, k, key)
				}
			}
		}
	}

	for env, key := range map[string]string{"SIDECAR_KEY_SALT": "key-salt", "SIDECAR_REDIS_PASSWORD": "redis-password"} {
		e := podspec.Env(t, c, env)
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Errorf("%s is not from a Secret: %+v", env, e)
			continue
		}
		ref := e.ValueFrom.SecretKeyRef
		sec := s.secrets[ref.Name]
		if sec == nil {
			t.Errorf("%s names the Secret %s, which the example does not have", env, ref.Name)
			continue
		}
		if ref.Key != key {
			t.Errorf("%s from key %s, want %s", env, ref.Key, key)
		}
		if _, ok := sec.StringData[ref.Key]; !ok {
			if _, ok := sec.Data[ref.Key]; !ok {
				t.Errorf("Secret %s has no key %s", sec.Name, ref.Key)
			}
		}
	}
	redis := podspec.Env(t, c, "SIDECAR_REDIS").Value
	u, err := url.Parse(redis)
	if err != nil || u.Host == "" || net.ParseIP(u.Hostname()) != nil && net.ParseIP(u.Hostname()).IsLoopback() {
		t.Errorf("SIDECAR_REDIS %q is not an external Redis", redis)
	} else if _, has := u.User.Password(); has {
		t.Errorf("SIDECAR_REDIS %q holds a password; it belongs in the Secret", redis)
	}

	_, adminPortText, err := net.SplitHostPort(podspec.Arg(t, c, "-admin-listen"))
	if err != nil {
		t.Fatal(err)
	}
	adminPort, _ := strconv.Atoi(adminPortText)
	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("sidecar %s probe %+v, want an HTTP GET", name, p)
			continue
		}
		if got := podspec.Port(t, c, p.HTTPGet.Port); got != adminPort {
			t.Errorf("sidecar %s probe on port %d, want the admin port %d", name, got, adminPort)
		}
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds < 5 {
		t.Errorf("sidecar preStop %+v, want a sleep outliving the proxy's drain", c.Lifecycle)
	} else if g := s.pod.TerminationGracePeriodSeconds; g == nil || *g <= c.Lifecycle.PreStop.Sleep.Seconds {
		t.Errorf("terminationGracePeriodSeconds %v does not cover the sidecar's preStop", g)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("sidecar resources %+v", c.Resources)
	}
}

// listenAddr is the sidecar's -listen, split.
func listenAddr(t *testing.T, c *corev1.Container) (string, int) {
	t.Helper()
	host, port, err := net.SplitHostPort(podspec.Arg(t, c, "-listen"))
	if err != nil {
		t.Fatalf("-listen: %v", err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("-listen port: %v", err)
	}
	return host, p
}

// selects reports whether every label of sel is on labels.
func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// decodeEnvoyYAML decodes envoy/envoy.yaml into v, which names the fields
// a test reads.
func decodeEnvoyYAML(t *testing.T, v any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "envoy", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, v); err != nil {
		t.Fatal(err)
	}
}

// sidecarCluster is what envoy/envoy.yaml sets on the callout's cluster.
type sidecarCluster struct {
	maxConnections, maxPending, maxRequests int
	connectTimeout                          time.Duration
}

// shippedSidecarCluster reads envoy/envoy.yaml's ratelimit_sidecar cluster.
func shippedSidecarCluster(t *testing.T) sidecarCluster {
	t.Helper()
	var boot struct {
		StaticResources struct {
			Clusters []struct {
				Name            string `json:"name"`
				ConnectTimeout  string `json:"connect_timeout"`
				CircuitBreakers struct {
					Thresholds []struct {
						MaxConnections     int `json:"max_connections"`
						MaxPendingRequests int `json:"max_pending_requests"`
						MaxRequests        int `json:"max_requests"`
					} `json:"thresholds"`
				} `json:"circuit_breakers"`
			} `json:"clusters"`
		} `json:"static_resources"`
	}
	decodeEnvoyYAML(t, &boot)
	for _, c := range boot.StaticResources.Clusters {
		if c.Name != "ratelimit_sidecar" || len(c.CircuitBreakers.Thresholds) != 1 {
			continue
		}
		d, err := time.ParseDuration(c.ConnectTimeout)
		if err != nil {
			t.Fatalf("envoy.yaml ratelimit_sidecar connect_timeout: %v", err)
		}
		th := c.CircuitBreakers.Thresholds[0]
		return sidecarCluster{th.MaxConnections, th.MaxPendingRequests, th.MaxRequests, d}
	}
	t.Fatal("envoy.yaml: no ratelimit_sidecar cluster with one circuit breaker threshold")
	return sidecarCluster{}
}

// edgeHCM is what envoy/envoy.yaml's edge listener's HTTP connection
// manager sets against hostile clients (its comments say which attack
// each stops). Each example carries these through its platform's own
// API where the platform has one, and its README says where it has not.
type edgeHCM struct {
	useRemoteAddress     bool
	internalAddresses    int    // internal_address_config's cidr_ranges; -1: the field is unset
	underscoresAction    string // common_http_protocol_options.headers_with_underscores_action
	proxy100Continue     bool
	normalizePath        bool
	mergeSlashes         bool
	escapedSlashesAction string // path_with_escaped_slashes_action
	acceptHTTP10         bool   // http_protocol_options.accept_http_10
	streamIdleTimeout    time.Duration
	// http2_protocol_options, 0 when unset (Envoy's default then differs
	// by release).
	h2MaxConcurrentStreams, h2StreamWindow, h2ConnectionWindow uint32
}

// shippedEdgeHCM reads envoy/envoy.yaml's edge listener's connection
// manager.
func shippedEdgeHCM(t *testing.T) edgeHCM {
	t.Helper()
	var boot struct {
		StaticResources struct {
			Listeners []struct {
				Name         string `json:"name"`
				FilterChains []struct {
					Filters []struct {
						Name        string `json:"name"`
						TypedConfig struct {
							UseRemoteAddress      bool `json:"use_remote_address"`
							InternalAddressConfig *struct {
								CidrRanges []any `json:"cidr_ranges"`
							} `json:"internal_address_config"`
							CommonHTTPProtocolOptions struct {
								HeadersWithUnderscoresAction string `json:"headers_with_underscores_action"`
							} `json:"common_http_protocol_options"`
							HTTPProtocolOptions struct {
								AcceptHTTP10 bool `json:"accept_http_10"`
							} `json:"http_protocol_options"`
							Proxy100Continue             bool   `json:"proxy_100_continue"`
							NormalizePath                bool   `json:"normalize_path"`
							MergeSlashes                 bool   `json:"merge_slashes"`
							PathWithEscapedSlashesAction string `json:"path_with_escaped_slashes_action"`
							StreamIdleTimeout            string `json:"stream_idle_timeout"`
							HTTP2ProtocolOptions         struct {
								MaxConcurrentStreams        uint32 `json:"max_concurrent_streams"`
								InitialStreamWindowSize     uint32 `json:"initial_stream_window_size"`
								InitialConnectionWindowSize uint32 `json:"initial_connection_window_size"`
							} `json:"http2_protocol_options"`
						} `json:"typed_config"`
					} `json:"filters"`
				} `json:"filter_chains"`
			} `json:"listeners"`
		} `json:"static_resources"`
	}
	decodeEnvoyYAML(t, &boot)
	for _, l := range boot.StaticResources.Listeners {
		if l.Name != "edge" || len(l.FilterChains) != 1 || len(l.FilterChains[0].Filters) != 1 {
			continue
		}
		c := l.FilterChains[0].Filters[0].TypedConfig
		h := edgeHCM{
			useRemoteAddress:       c.UseRemoteAddress,
			underscoresAction:      cmp.Or(c.CommonHTTPProtocolOptions.HeadersWithUnderscoresAction, "ALLOW"),
			proxy100Continue:       c.Proxy100Continue,
			normalizePath:          c.NormalizePath,
			mergeSlashes:           c.MergeSlashes,
			escapedSlashesAction:   cmp.Or(c.PathWithEscapedSlashesAction, "KEEP_UNCHANGED"),
			acceptHTTP10:           c.HTTPProtocolOptions.AcceptHTTP10,
			streamIdleTimeout:      5 * time.Minute, // Envoy's default
			internalAddresses:      -1,
			h2MaxConcurrentStreams: c.HTTP2ProtocolOptions.MaxConcurrentStreams,
			h2StreamWindow:         c.HTTP2ProtocolOptions.InitialStreamWindowSize,
			h2ConnectionWindow:     c.HTTP2ProtocolOptions.InitialConnectionWindowSize,
		}
		if c.InternalAddressConfig != nil {
			h.internalAddresses = len(c.InternalAddressConfig.CidrRanges)
		}
		if c.StreamIdleTimeout != "" {
			var err error
			if h.streamIdleTimeout, err = time.ParseDuration(c.StreamIdleTimeout); err != nil {
				t.Fatalf("envoy.yaml edge stream_idle_timeout: %v", err)
			}
		}
		return h
	}
	t.Fatal("envoy.yaml: no edge listener with one connection manager")
	return edgeHCM{}
}

// The shipped connection manager as the examples were written against it:
// the edge protections each example carries or its README documents as a
// gap. A change here is a change the examples and their READMEs must
// follow.
func checkShippedEdgeHCM(t *testing.T) edgeHCM {
	t.Helper()
	h := shippedEdgeHCM(t)
	want := edgeHCM{
		useRemoteAddress: true, internalAddresses: 0, underscoresAction: "REJECT_REQUEST",
		proxy100Continue: true, normalizePath: true, mergeSlashes: true,
		escapedSlashesAction: "UNESCAPE_AND_REDIRECT", acceptHTTP10: false, streamIdleTimeout: 10 * time.Second,
		h2MaxConcurrentStreams: 100, h2StreamWindow: 64 << 10, h2ConnectionWindow: 1 << 20,
	}
	if h != want {
		t.Errorf("envoy.yaml's edge connection manager is now %+v, the mesh examples follow %+v: update them and their READMEs", h, want)
	}
	return h
}
