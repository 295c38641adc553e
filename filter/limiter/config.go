package limiter

import (
	"errors"
	"strconv"
	"strings"
	"unsafe"

	"github.com/edgelimit/edgelimit/internal/region"
)

// Mode is what the filter does with a client's request.
type Mode uint8

// Modes. The zero value is ModeEnforce, the default.
const (
	// ModeEnforce asks the sidecar and rejects denied requests with 429.
	ModeEnforce Mode = iota
	// ModeShadow asks the sidecar, never rejects, and tells the service the
	// decision in the x-ratelimit-shadow request header.
	ModeShadow
	// ModeOff makes no callout at all.
	ModeOff
)

func (m Mode) String() string {
	switch m {
	case ModeShadow:
		return "shadow"
	case ModeOff:
		return "off"
	}
	return "enforce"
}

// CostRule gives the cost of the requests it matches. A rule matches when
// every field it sets matches: Method exactly, PathPrefix as a plain prefix
// of :path (query string included).
type CostRule struct {
	Method     string
	PathPrefix string
	Cost       int64
}

// Config is the filter's validated configuration, read from the plugin
// configuration (JSON) in proxy_on_configure. The zero value is not valid;
// use Parse, or DefaultConfig for the defaults.
type Config struct {
	// SidecarCluster is the Envoy cluster of the sidecar.
	// Defaults to "ratelimit_sidecar".
	SidecarCluster string
	// SidecarAuthority is the callout's :authority.
	// Defaults to "ratelimit-sidecar".
	SidecarAuthority string
	// TimeoutMs is the callout timeout; on timeout the request fails open.
	// Defaults to 5.
	TimeoutMs uint32
	// APIKeyHeader is the (lower-case) request header holding the API key;
	// "authorization: Bearer <key>" is accepted too. Defaults to "x-api-key".
	APIKeyHeader string
	// Mode defaults to ModeEnforce.
	Mode Mode
	// CanaryClients, when not empty, limits enforcement to these API keys;
	// every other client runs in shadow. It only matters in ModeEnforce.
	CanaryClients map[string]struct{}
	// RejectMissingKey answers requests without a usable key with 401; when
	// false they go through unlimited. Defaults to true
	// (on_missing_key "reject").
	RejectMissingKey bool
	// Costs are the per-route cost rules; the first match wins and the
	// default cost is 1.
	Costs []CostRule
	// Region is sent to the sidecar as x-ratelimit-region when not empty.
	Region string
	// Breaker is the circuit breaker on the callout. Defaults to 20 failures,
	// 100 ms to 5000 ms open.
	Breaker BreakerConfig
	// OnFailure is what happens to an enforced request the sidecar cannot
	// decide (local.go). Defaults to FailOpen.
	OnFailure FailureMode
	// WarmConnections is how many connections to the sidecar each root
	// context opens ahead of traffic, and keeps open (warm.go). Defaults to
	// DefaultWarmConnections; 0 opens none.
	WarmConnections uint32
}

// Limits on configuration values.
const (
	// MaxConfigBytes bounds the configuration's text: room for a canary
	// of 10,000 keys of 64 characters, about 2.4 MiB of each VM's memory
	// (filter/RATIONALE.md, "Why the configuration is at most 1 MiB").
	MaxConfigBytes = 1 << 20
	// MaxCanaryClients bounds canary_clients: what a VM keeps follows the
	// number of keys more than the text's size (a map entry each), and 1
	// MiB of keys of 3 characters would be 170,000 of them.
	MaxCanaryClients = 20000
	MaxTimeoutMs     = 60000
	MaxCost          = 1000000
	MaxCostRules     = 256
	maxNameLen       = 255
	maxMethodLen     = 32
	maxPathPrefix    = 1024
	maxQuotedLength  = 64
	// MaxWarmConnections bounds warm_connections. Every worker's round
	// goes out at once and shares the sidecar cluster's circuit breaker
	// (Envoy's default: 1024 requests at once) with the checks: 16
	// workers at this bound fill it.
	MaxWarmConnections = 64
	// DefaultWarmConnections covers a burst of a few tens of requests at
	// once over a proxy's workers without a connection set up within a
	// check's 5 ms.
	DefaultWarmConnections = 16
)

// DefaultConfig returns the configuration an empty plugin configuration
// means.
func DefaultConfig() *Config {
	return &Config{
		SidecarCluster:   "ratelimit_sidecar",
		SidecarAuthority: "ratelimit-sidecar",
		TimeoutMs:        5,
		APIKeyHeader:     KeyHeader,
		Mode:             ModeEnforce,
		RejectMissingKey: true,
		Breaker: BreakerConfig{
			Failures:  DefaultBreakerFailures,
			MinOpenMs: DefaultBreakerMinOpenMs,
			MaxOpenMs: DefaultBreakerMaxOpenMs,
		},
		WarmConnections: DefaultWarmConnections,
	}
}

// Parse reads and validates a plugin configuration. Empty input (or only
// whitespace) means every default. The error names the field and quotes the
// value, e.g. "timeout_ms: must be > 0, got -3"; API keys in canary_clients
// are never quoted.
func Parse(data []byte) (*Config, error) {
	c := DefaultConfig()
	if len(data) > MaxConfigBytes {
		return nil, tooLarge(data)
	}
	if onlySpace(data) {
		return c, nil
	}
	// The text is copied once, and every string the configuration keeps
	// (a canary list's keys above all) is a substring of that copy. It is
	// read whole first, so that a syntax error anywhere comes before any
	// other; then field by field, an array or object within a field being
	// read entry by entry where it is used, with no tree of the whole.
	root, err := parseText(string(data), 1)
	if err != nil {
		return nil, errors.New("configuration: " + err.Error())
	}
	if root.kind != jsonObject {
		return nil, errors.New("configuration: must be a JSON object, got " + render(root))
	}
	fields, err := knownFields("configuration", root, topFields)
	if err != nil {
		return nil, err
	}
	for _, f := range fields {
		if err := c.set(f.name, f.value); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// onlySpace reports whether data holds JSON whitespace only.
func onlySpace(data []byte) bool {
	for _, b := range data {
		if b != ' ' && b != '\t' && b != '\r' && b != '\n' {
			return false
		}
	}
	return true
}

// maxDiagnosedBytes is the largest configuration whose refusal for its
// size says which field makes it so: it is read for that alone, once, on
// a configuration that is refused.
const maxDiagnosedBytes = 16 * MaxConfigBytes

// tooLarge is the error for a configuration of more than MaxConfigBytes.
// When the text is a JSON object (of at most maxDiagnosedBytes), it names
// the field that holds most of it, name and value together, with its
// number of entries for a list and its length for a string, never its
// value: a long canary_clients is the usual cause, and its entries are API
// keys. A long name is cut as every quoted value is.
func tooLarge(data []byte) error {
	msg := "configuration: must be at most " + strconv.Itoa(MaxConfigBytes) + " bytes, got " + strconv.Itoa(len(data))
	if len(data) > maxDiagnosedBytes || !startsObject(data) {
		return errors.New(msg)
	}
	// A view of data, not a copy: nothing read from it outlives this
	// function (the message is built of copies), and a refused text of up
	// to maxDiagnosedBytes would otherwise take as much again of the VM's
	// memory, which a wasm VM never gives back. Its strings are measured,
	// not decoded, for the same reason.
	root, err := parseText(unsafe.String(unsafe.SliceData(data), len(data)), 1)
	if err != nil || root.kind != jsonObject || root.n == 0 {
		return errors.New(msg)
	}
	// Its fields are read as within a summary, every string measured and
	// none decoded but the largest field's name, and of that only what an
	// error shows: a text of escapes costs no more than one without. A
	// field's size is its name's and its value's, as written.
	var big jsonValue
	at, bigSize := -1, 0
	_ = readFields(root, true, func(nameAt int, _ string, nameLen int, value jsonValue) error {
		if size := nameLen + 4 + writtenSize(value); at < 0 || size > bigSize {
			big, at, bigSize = value, nameAt, size
		}
		return nil
	})
	p := jsonParser{data: root.text, pos: at}
	name, n := p.strPrefix(maxQuotedLength)
	switch {
	case n > maxQuotedLength:
		name = strconv.Quote(name) + "..."
	case !contains(topFields, name):
		name = quote(name)
	}
	msg += ", most of it " + name
	switch big.kind {
	case jsonArray:
		msg += " (" + strconv.Itoa(big.n) + " entries)"
	case jsonString:
		msg += " (a string of " + strconv.Itoa(big.size-2) + " bytes)"
	}
	return errors.New(msg)
}

// startsObject reports whether data's first byte past JSON whitespace is
// '{': only an object is read for its fields, and what starts otherwise
// need not be read (a string at the top would be decoded).
func startsObject(data []byte) bool {
	for _, b := range data {
		if b != ' ' && b != '\t' && b != '\r' && b != '\n' {
			return b == '{'
		}
	}
	return false
}

// writtenSize is about how many bytes v takes written compactly: its
// strings' decoded bytes, quotes and separators, which is what tells the
// field that makes a configuration large.
func writtenSize(v jsonValue) int {
	if v.summary {
		return v.size
	}
	switch v.kind {
	case jsonNull:
		return 4
	case jsonBool:
		return 5
	case jsonString:
		return len(v.text) + 2
	case jsonNumber:
		return len(v.text)
	}
	n := 2
	for _, it := range v.items {
		n += writtenSize(it) + 1
	}
	for _, f := range v.fields {
		n += len(f.name) + 4 + writtenSize(f.value)
	}
	return n
}

var topFields = []string{"sidecar_cluster", "sidecar_authority", "timeout_ms", "api_key_header",
	"mode", "canary_clients", "on_missing_key", "costs", "region", "breaker", "on_failure", "warm_connections"}

var ruleFields = []string{"method", "path_prefix", "cost"}

var breakerFields = []string{"failures", "min_open_ms", "max_open_ms"}

// knownFields returns the fields of the object summary obj, in order, and
// rejects unknown and repeated ones: the first of them in the text is the
// error. So it returns at most len(known) fields, whatever the object
// holds.
func knownFields(where string, obj jsonValue, known []string) ([]jsonField, error) {
	fields := make([]jsonField, 0, min(obj.n, len(known)))
	err := eachField(obj, func(name string, value jsonValue) error {
		if !contains(known, name) {
			return errors.New(where + ": unknown field " + quote(name))
		}
		for _, g := range fields {
			if g.name == name {
				return errors.New(where + ": duplicate field " + quote(name))
			}
		}
		fields = append(fields, jsonField{name: name, value: value})
		return nil
	})
	return fields, err
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (c *Config) set(name string, v jsonValue) error {
	switch name {
	case "sidecar_cluster":
		s, err := visibleString(name, v, 1, maxNameLen)
		c.SidecarCluster = s
		return err
	case "sidecar_authority":
		if v.kind != jsonString {
			return mustBe(name, "a string", v)
		}
		if len(v.text) > maxNameLen || !isAuthority(v.text) {
			return mustBe(name, "a host name, an IPv4 address or an IPv6 address in brackets, "+
				"then an optional :port, at most "+strconv.Itoa(maxNameLen)+" characters", v)
		}
		c.SidecarAuthority = v.text
	case "region":
		s, err := regionString(name, v)
		c.Region = s
		return err
	case "timeout_ms":
		n, err := integer(name, v, 1, MaxTimeoutMs)
		c.TimeoutMs = uint32(n)
		return err
	case "warm_connections":
		n, err := integer(name, v, 0, MaxWarmConnections)
		c.WarmConnections = uint32(n)
		return err
	case "api_key_header":
		if v.kind != jsonString {
			return mustBe(name, "a string", v)
		}
		h := asciiLower(v.text)
		if !isHeaderName(h) {
			return mustBe(name, "an HTTP header name", v)
		}
		switch h {
		case AuthorizationHeader:
			// Its value is "Bearer <key>", which is no key: every request
			// with a Bearer token would be refused as an invalid key.
			return errors.New(name + `: must not be "authorization": "authorization: Bearer <key>" is read ` +
				"whatever the header, leave api_key_header out or name another header, got " + render(v))
		case "host":
			// Envoy hands a filter the request's Host as :authority, over
			// HTTP/1 as over HTTP/2: no request would have a key.
			return errors.New(name + `: must not be "host": the proxy gives a filter the Host header as ":authority", ` +
				"so every request would be missing its key, got " + render(v))
		case ShadowHeader:
			// The filter removes a client's copy before it looks for the
			// key: every request would be missing its key.
			return errors.New(name + `: must not be "x-ratelimit-shadow", the filter's own header, got ` + render(v))
		}
		c.APIKeyHeader = h
	case "mode":
		switch {
		case v.kind == jsonString && v.text == "enforce":
			c.Mode = ModeEnforce
		case v.kind == jsonString && v.text == "shadow":
			c.Mode = ModeShadow
		case v.kind == jsonString && v.text == "off":
			c.Mode = ModeOff
		default:
			return mustBe(name, `"enforce", "shadow" or "off"`, v)
		}
	case "on_missing_key":
		switch {
		case v.kind == jsonString && v.text == "reject":
			c.RejectMissingKey = true
		case v.kind == jsonString && v.text == "allow":
			c.RejectMissingKey = false
		default:
			return mustBe(name, `"reject" or "allow"`, v)
		}
	case "on_failure":
		switch {
		case v.kind == jsonString && v.text == "open":
			c.OnFailure = FailOpen
		case v.kind == jsonString && v.text == "local":
			c.OnFailure = FailLocal
		default:
			return mustBe(name, `"open" or "local"`, v)
		}
	case "canary_clients":
		return c.setCanary(v)
	case "costs":
		return c.setCosts(v)
	case "breaker":
		return c.setBreaker(v)
	}
	return nil
}

// setBreaker reads the breaker object; fields it leaves out keep their
// defaults, except that an omitted max_open_ms is raised to min_open_ms.
func (c *Config) setBreaker(v jsonValue) error {
	if v.kind != jsonObject {
		return mustBe("breaker", "an object", v)
	}
	fields, err := knownFields("breaker", v, breakerFields)
	if err != nil {
		return err
	}
	b := DefaultConfig().Breaker
	maxSet := false
	for _, f := range fields {
		field := "breaker." + f.name
		var n int64
		var err error
		switch f.name {
		case "failures":
			n, err = integer(field, f.value, 0, MaxBreakerFailures)
			b.Failures = uint32(n)
		case "min_open_ms":
			n, err = integer(field, f.value, 1, MaxBreakerOpenMs)
			b.MinOpenMs = uint32(n)
		case "max_open_ms":
			n, err = integer(field, f.value, 1, MaxBreakerOpenMs)
			b.MaxOpenMs, maxSet = uint32(n), true
		}
		if err != nil {
			return err
		}
	}
	if !maxSet {
		b.MaxOpenMs = max(b.MaxOpenMs, b.MinOpenMs)
	}
	if b.MaxOpenMs < b.MinOpenMs {
		return errors.New("breaker.max_open_ms: must be >= min_open_ms (" +
			strconv.FormatUint(uint64(b.MinOpenMs), 10) + "), got " + strconv.FormatUint(uint64(b.MaxOpenMs), 10))
	}
	c.Breaker = b
	return nil
}

func (c *Config) setCanary(v jsonValue) error {
	if v.kind != jsonArray {
		return errors.New("canary_clients: must be an array of API keys, got " + renderSecret(v))
	}
	if v.n == 0 {
		return nil
	}
	if v.n > MaxCanaryClients {
		return errors.New("canary_clients: must have at most " + strconv.Itoa(MaxCanaryClients) +
			" keys, got " + strconv.Itoa(v.n))
	}
	// Read key by key into a map of its final size: a key is a substring
	// of the configuration's one copy, with no node or copy of its own.
	clients := make(map[string]struct{}, v.n)
	c.CanaryClients = clients
	return eachItem(v, 1, func(i int, item jsonValue) error {
		if item.kind != jsonString {
			return errors.New("canary_clients[" + strconv.Itoa(i) + "]: must be a string, got " + renderSecret(item))
		}
		// The value is an API key: say what is wrong without logging it.
		if !ValidKey(item.text) {
			return errors.New("canary_clients[" + strconv.Itoa(i) + "]: must be an API key of 1 to " +
				strconv.Itoa(MaxKeyLen) + " visible ASCII characters, got " + renderSecret(item))
		}
		clients[item.text] = struct{}{}
		return nil
	})
}

func (c *Config) setCosts(v jsonValue) error {
	if v.kind != jsonArray {
		return mustBe("costs", "an array of rules", v)
	}
	if v.n > MaxCostRules {
		return errors.New("costs: must have at most " + strconv.Itoa(MaxCostRules) +
			" rules, got " + strconv.Itoa(v.n))
	}
	c.Costs = make([]CostRule, 0, v.n)
	return eachItem(v, 1, func(i int, item jsonValue) error {
		where := "costs[" + strconv.Itoa(i) + "]"
		if item.kind != jsonObject {
			return mustBe(where, "an object", item)
		}
		fields, err := knownFields(where, item, ruleFields)
		if err != nil {
			return err
		}
		var rule CostRule
		hasCost := false
		for _, f := range fields {
			field := where + "." + f.name
			switch f.name {
			case "method":
				if f.value.kind != jsonString || !isMethod(f.value.text) {
					return mustBe(field, `an upper-case HTTP method such as "POST"`, f.value)
				}
				rule.Method = f.value.text
			case "path_prefix":
				if f.value.kind != jsonString || !isPathPrefix(f.value.text) {
					return mustBe(field, `a path starting with "/" of at most `+
						strconv.Itoa(maxPathPrefix)+" visible ASCII characters", f.value)
				}
				rule.PathPrefix = f.value.text
			case "cost":
				n, err := integer(field, f.value, 1, MaxCost)
				if err != nil {
					return err
				}
				rule.Cost, hasCost = n, true
			}
		}
		if rule.Method == "" && rule.PathPrefix == "" {
			return errors.New(where + `: must set "method" or "path_prefix" or both`)
		}
		if !hasCost {
			return errors.New(where + `: missing field "cost"`)
		}
		// The first matching rule wins: a rule an earlier one matches
		// every request of would never set a cost, and its requests would
		// pay the earlier rule's instead.
		for j := range c.Costs {
			if e := &c.Costs[j]; (e.Method == "" || e.Method == rule.Method) && strings.HasPrefix(rule.PathPrefix, e.PathPrefix) {
				return errors.New(where + ": never matches: costs[" + strconv.Itoa(j) +
					"] matches every request it does, and the first matching rule wins; put the narrower rule first")
			}
		}
		c.Costs = append(c.Costs, rule)
		return nil
	})
}

// Cost returns the cost of a request: the first matching rule's, else 1.
func (c *Config) Cost(method, path string) int64 {
	for i := range c.Costs {
		r := &c.Costs[i]
		if (r.Method == "" || r.Method == method) && strings.HasPrefix(path, r.PathPrefix) {
			return r.Cost
		}
	}
	return 1
}

// Enforced reports whether the request of client key may be rejected: in
// ModeEnforce, for every client or, with a canary list, only for those in
// it. A request without a valid key is key "", in no canary list.
func (c *Config) Enforced(key string) bool {
	if c.Mode != ModeEnforce {
		return false
	}
	if len(c.CanaryClients) == 0 {
		return true
	}
	_, ok := c.CanaryClients[key]
	return ok
}

// integer reads a JSON integer within [lo, hi].
func integer(field string, v jsonValue, lo, hi int64) (int64, error) {
	if v.kind != jsonNumber {
		return 0, mustBe(field, "a number", v)
	}
	if strings.ContainsAny(v.text, ".eE") {
		return 0, mustBe(field, "an integer", v)
	}
	n, err := strconv.ParseInt(v.text, 10, 64)
	switch {
	case err != nil && v.text[0] == '-', err == nil && n < lo:
		if lo == 1 {
			return 0, mustBe(field, "> 0", v)
		}
		return 0, mustBe(field, ">= "+strconv.FormatInt(lo, 10), v)
	case err != nil, n > hi:
		return 0, mustBe(field, "<= "+strconv.FormatInt(hi, 10), v)
	}
	return n, nil
}

// visibleString reads a string of lo to hi visible ASCII characters.
func visibleString(field string, v jsonValue, lo, hi int) (string, error) {
	if v.kind != jsonString {
		return "", mustBe(field, "a string", v)
	}
	if len(v.text) < lo || len(v.text) > hi || !isVisible(v.text) {
		rule := "at most " + strconv.Itoa(hi) + " visible ASCII characters"
		if lo > 0 {
			rule = strconv.Itoa(lo) + " to " + strconv.Itoa(hi) + " visible ASCII characters"
		}
		return "", mustBe(field, rule, v)
	}
	return v.text, nil
}

// regionString reads the region: what the sidecar accepts in
// x-ratelimit-region (region.Valid). A region the sidecar would refuse
// would have every check answered 400, and every request fail open.
func regionString(field string, v jsonValue) (string, error) {
	if v.kind != jsonString {
		return "", mustBe(field, "a string", v)
	}
	if !region.Valid(v.text) {
		return "", mustBe(field, region.Rule, v)
	}
	return v.text, nil
}

func mustBe(field, rule string, v jsonValue) error {
	return errors.New(field + ": must be " + rule + ", got " + render(v))
}

// render shows a JSON value in an error: strings quoted (and cut after 64
// bytes), numbers as written, containers by kind.
func render(v jsonValue) string {
	switch v.kind {
	case jsonString:
		return quote(v.text)
	case jsonNumber:
		if len(v.text) > maxQuotedLength {
			return v.text[:maxQuotedLength] + "..."
		}
		return v.text
	case jsonBool:
		if v.b {
			return "true"
		}
		return "false"
	case jsonArray:
		return "an array"
	case jsonObject:
		return "an object"
	}
	return "null"
}

// renderSecret shows a value that may be an API key in an error: its kind
// and, for a string, its length, never its text. A key written as a string
// where the list belongs, or as a number, is still a key.
func renderSecret(v jsonValue) string {
	switch v.kind {
	case jsonString:
		return "a string of " + strconv.Itoa(len(v.text)) + " bytes (not shown: API keys are never logged)"
	case jsonNumber:
		return "a number (not shown: API keys are never logged)"
	}
	return render(v)
}

func quote(s string) string {
	if len(s) > maxQuotedLength {
		return strconv.Quote(s[:maxQuotedLength]) + "..."
	}
	return strconv.Quote(s)
}

// isVisible reports whether s is made of visible ASCII (0x21-0x7E) only.
func isVisible(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// isHeaderName reports whether s is a lower-case HTTP field name (RFC 9110
// token); pseudo-headers such as ":path" are not.
func isHeaderName(s string) bool {
	if s == "" || len(s) > maxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// isAuthority reports whether s is what an HTTP Host header holds (RFC
// 9110: uri-host [":" port]): a name of unreserved and sub-delims
// characters (an IPv4 address is one), or an IPv6 address in brackets,
// then an optional port of 1 to 5 digits. The callout's :authority is the
// sidecar's Host, and the sidecar answers 400 to one that is not (a "/",
// "@" or "%" in it, a port that is not a number), which would fail every
// request open. Percent-encoding, which RFC 3986 allows in a name, is
// left out: the sidecar refuses it too, and no host name needs it.
func isAuthority(s string) bool {
	port, hasPort := "", false
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 2 || strings.Trim(s[1:end], "0123456789abcdefABCDEF:.") != "" {
			return false
		}
		switch rest := s[end+1:]; {
		case rest == "":
			return true
		case rest[0] != ':':
			return false
		default:
			port, hasPort = rest[1:], true
		}
	} else {
		host := s
		if i := strings.LastIndexByte(s, ':'); i >= 0 {
			host, port, hasPort = s[:i], s[i+1:], true
		}
		if host == "" {
			return false
		}
		for i := 0; i < len(host); i++ {
			c := host[i]
			switch {
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
			case strings.IndexByte("-._~!$&'()*+,;=", c) >= 0:
			default:
				return false
			}
		}
	}
	if hasPort && (port == "" || len(port) > 5 || strings.Trim(port, "0123456789") != "") {
		return false
	}
	return true
}

func isMethod(s string) bool {
	if s == "" || len(s) > maxMethodLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}

func isPathPrefix(s string) bool {
	return len(s) <= maxPathPrefix && strings.HasPrefix(s, "/") && isVisible(s)
}

// asciiLower lower-cases ASCII letters only, which is all a header name may
// hold; strings.ToLower would link the Unicode tables into the module.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
