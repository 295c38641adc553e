// Package plans reads the sidecar's plans file: which limit (capacity and
// refill rate) applies to which API key.
//
// The file is YAML:
//
//	default_plan: free          # plan for API keys not listed; omit to answer 403 for unknown keys
//	plans:
//	  free: {capacity: 10, rate: 1}      # rate in tokens per second, fractions allowed
//	  pro:  {capacity: 200, rate: 100}
//	clients:
//	  "client-key-123": pro
//	  "huge-client-key": {plan: pro, regions: [eu, us, ap]}   # hot: one bucket per region
//	  "sha256:<64 hex>": pro      # a client by digest (keys.Digester.Digest)
//
// A rate is tokens per second, or a string such as "6000/min" (ParseRate).
// Parse is the one place the file is validated. Every problem is reported,
// each as "file:line: field: what is wrong, got value"; unknown fields are
// errors. API keys from the clients section are never quoted in an error.
package plans

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/edgelimit/edgelimit/internal/region"
	"github.com/edgelimit/edgelimit/sidecar/keys"
)

// rateRE is a rate in human units: a decimal number, an optional k (10^3),
// M (10^6) or G (10^9), a slash and a unit of time.
var rateRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)([kMG]?)/(s|min|h|day)$`)

// ParseRate reads a rate such as "100/s", "6000/min", "2.5k/h" or "1M/day"
// and returns it in tokens per second, within (0, MaxRate].
func ParseRate(s string) (float64, error) {
	m := rateRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("must be a number of tokens per second or a rate such as \"100/s\", \"6000/min\", \"2.5k/h\", \"1M/day\" (k, M, G; s, min, h, day), got %q", s)
	}
	n, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, fmt.Errorf("bad number in rate %q: %v", s, err)
	}
	n *= map[string]float64{"": 1, "k": 1e3, "M": 1e6, "G": 1e9}[m[2]]
	r := n / map[string]float64{"s": 1, "min": 60, "h": 3600, "day": 86400}[m[3]]
	if !(r > 0) || r > MaxRate {
		return 0, fmt.Errorf("must be > 0 and at most %d tokens per second, got %q (%g/s)", MaxRate, s, r)
	}
	return r, nil
}

// Limits on what a plans file may say. Capacity and cost share their upper
// bound so that every cost the sidecar accepts can fit some plan.
const (
	MaxCapacity   = 1_000_000_000 // tokens
	MaxRate       = 1_000_000_000 // tokens per second
	MaxRefillSecs = 365 * 24 * 3600
	MaxNameLen    = region.MaxLen // a plan's or a region's name
	MaxFileSize   = 16 << 20      // bytes
	// MinRegions and MaxRegions bound a hot client's region list.
	MinRegions = 2
	MaxRegions = 16
)

// Plan is one named limit.
type Plan struct {
	Name     string
	Capacity float64 // whole tokens, 1 to MaxCapacity
	Rate     float64 // tokens added per second, > 0, fractions allowed

	// LimitHeader is Capacity formatted for the ratelimit-limit header,
	// computed once here rather than on every request.
	LimitHeader string
}

// Plans is one parsed plans file. It is immutable once returned by Parse, so
// readers may share it without locks.
type Plans struct {
	File    string           // the file it came from, for logs
	Default *Plan            // plan for unknown keys; nil means answer 403
	ByName  map[string]*Plan // every plan
	clients map[string]*Plan // API key → plan
	hot     map[string]*Hot  // API key → sharding, for hot clients only
	// Clients listed by digest ("sha256:<hex>" or "hmac-sha256:<hex>"),
	// keyed by the 32-byte digest; DigestKind is the one kind the file uses
	// ("" when it lists none).
	DigestKind string
	byDigest   map[[sha256.Size]byte]*Plan
	hotDigest  map[[sha256.Size]byte]*Hot
}

// Hot says how a hot client's bucket is split: one bucket per region, each
// with a share of the plan (see package sidecar/hot).
type Hot struct {
	// Regions as listed, 2 to MaxRegions distinct names. A check whose
	// x-ratelimit-region is not listed (or absent) uses the first.
	Regions []string
}

// HotClient returns how apiKey's bucket is split when the file lists that
// key as a hot client, else nil (a hot client listed by digest included).
func (p *Plans) HotClient(apiKey []byte) *Hot {
	if len(p.hot) == 0 {
		return nil
	}
	return p.hot[string(apiKey)]
}

// HotClients returns how many clients are marked hot.
func (p *Plans) HotClients() int { return len(p.hot) + len(p.hotDigest) }

// Lookup returns the plan of apiKey: its own, else the default plan. ok is
// false when the key is not listed and there is no default plan. Clients
// listed by sha256: digest are found too; those listed by hmac-sha256:
// digest need the salt, hence LookupSum.
func (p *Plans) Lookup(apiKey []byte) (plan *Plan, ok bool) {
	var sum [sha256.Size]byte
	if p.DigestKind == keys.KindSHA256 {
		sum = sha256.Sum256(apiKey)
	}
	plan, _, ok = p.LookupSum(apiKey, sum)
	return plan, ok
}

// LookupSum returns the plan of apiKey, whose digest (keys.Digester.Sum,
// with the sidecar's salt) is sum, and how its bucket is split if it is a
// hot client: a client listed by key first, then one listed by digest, else
// the default plan. ok is false when the client is not listed and there is
// no default plan.
func (p *Plans) LookupSum(apiKey []byte, sum [sha256.Size]byte) (plan *Plan, hot *Hot, ok bool) {
	// string(apiKey) in a map index does not allocate.
	if plan, ok := p.clients[string(apiKey)]; ok {
		return plan, p.hot[string(apiKey)], true
	}
	if plan, ok := p.byDigest[sum]; ok {
		return plan, p.hotDigest[sum], true
	}
	return p.Default, nil, p.Default != nil
}

// Clients returns how many clients the file lists, by key or by digest.
func (p *Plans) Clients() int { return len(p.clients) + len(p.byDigest) }

// CheckDigests reports a file whose digests the sidecar cannot match: listed
// as kind while the sidecar computes want (keys.Digester.Kind). A sidecar
// with a -key-salt needs hmac-sha256: digests computed with the same salt;
// one without needs sha256: digests.
func (p *Plans) CheckDigests(want string) error {
	if p.DigestKind == "" || p.DigestKind == want {
		return nil
	}
	why := "-key-salt is set"
	if want == keys.KindSHA256 {
		why = "no -key-salt is set"
	}
	return &FieldError{File: p.File, Field: "clients", Msg: fmt.Sprintf(
		"clients are listed by %s: digests but %s, so the sidecar computes %s: digests; list them as \"sidecar digest\" prints them with this sidecar's salt",
		p.DigestKind, why, want)}
}

// FieldError is one problem found in a plans file.
type FieldError struct {
	File  string
	Line  int // 1-based; 0 when the problem is not tied to a line
	Field string
	Msg   string
}

func (e *FieldError) Error() string {
	loc := e.File
	if e.Line > 0 {
		loc += ":" + strconv.Itoa(e.Line)
	}
	if e.Field == "" {
		return loc + ": " + e.Msg
	}
	return loc + ": " + e.Field + ": " + e.Msg
}

// Load reads and parses the plans file at path.
func Load(path string) (*Plans, error) {
	data, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// ReadFile reads a plans file, refusing one larger than MaxFileSize.
func ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read plans: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read plans %s: %w", path, err)
	}
	if len(data) > MaxFileSize {
		return nil, &FieldError{File: path, Msg: fmt.Sprintf("file larger than %d bytes", MaxFileSize)}
	}
	return data, nil
}

// Parse validates data, the content of the plans file named file (used in
// error messages only). The error, if any, joins one *FieldError per
// problem, ordered by line.
func Parse(file string, data []byte) (*Plans, error) {
	p := &parser{file: file, declared: map[string]bool{}, sums: map[[sha256.Size]byte]int{}}
	plans := p.parse(data)
	if len(p.errs) > 0 {
		slices.SortStableFunc(p.errs, func(a, b *FieldError) int { return a.Line - b.Line })
		errs := make([]error, len(p.errs))
		for i, e := range p.errs {
			errs[i] = e
		}
		return nil, errors.Join(errs...)
	}
	return plans, nil
}

type parser struct {
	file string
	errs []*FieldError
	// declared holds every well-formed plan name, valid body or not, so a
	// reference to a plan with a bad body is not reported a second time as
	// a reference to a missing plan.
	declared map[string]bool
	// sums holds the SHA-256 of every client listed by key or by sha256:
	// digest, with its line, to find a client listed both ways.
	sums map[[sha256.Size]byte]int
	// digestLine is the line of the first client listed by digest.
	digestLine int
}

// firstNotUTF8 returns the line (1-based) of data's first byte that does
// not begin a valid UTF-8 sequence, and that byte's place on its line
// (1-based); 0, 0 when data is UTF-8 or starts with a UTF-16 byte order
// mark (the YAML decoder reads UTF-16 too).
func firstNotUTF8(data []byte) (line, at int) {
	if bytes.HasPrefix(data, []byte{0xff, 0xfe}) || bytes.HasPrefix(data, []byte{0xfe, 0xff}) {
		return 0, 0
	}
	start := 0
	line = 1
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && n == 1 {
			return line, i - start + 1
		}
		if data[i] == '\n' {
			line, start = line+1, i+1
		}
		i += n
	}
	return 0, 0
}

// resolve returns the plan called name, reporting a reference to a plan that
// is not declared at all.
func (p *parser) resolve(n *yaml.Node, field, name string, out *Plans) *Plan {
	if plan := out.ByName[name]; plan != nil {
		return plan
	}
	// With no plan declared at all the plans section is already reported;
	// every reference failing too would only bury that one error.
	if !p.declared[name] && len(p.declared) > 0 {
		p.fail(n, field, "no plan named %q%s", name, known(p.declared))
	}
	return nil
}

func (p *parser) fail(n *yaml.Node, field, format string, args ...any) {
	line := 0
	if n != nil {
		line = n.Line
	}
	p.errs = append(p.errs, &FieldError{File: p.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

func (p *parser) parse(data []byte) *Plans {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		switch line, at := firstNotUTF8(data); {
		case err == io.EOF:
			p.fail(nil, "", "empty file: a plans mapping is required")
		case line > 0 && strings.Contains(err.Error(), "UTF-8"):
			// The YAML decoder names no line for bytes that are not UTF-8
			// (a file saved as Latin-1), which in a file of many clients
			// leaves the operator searching. The line and the place on
			// it, never the bytes: they may be part of an API key.
			p.errs = append(p.errs, &FieldError{File: p.file, Line: line,
				Msg: fmt.Sprintf("this line is not UTF-8 (its byte %d is not a UTF-8 sequence); a plans file must be UTF-8", at)})
		default:
			p.fail(nil, "", "%v", err)
		}
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		p.fail(&extra, "", "more than one YAML document; put everything in one")
		return nil
	}
	root := deref(&doc)
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = deref(root.Content[0])
	}
	if root.Kind != yaml.MappingNode {
		p.fail(root, "", "top level must be a mapping with plans, clients and default_plan, got %s", describe(root))
		return nil
	}

	out := &Plans{File: p.file, ByName: map[string]*Plan{}, clients: map[string]*Plan{}, hot: map[string]*Hot{},
		byDigest: map[[sha256.Size]byte]*Plan{}, hotDigest: map[[sha256.Size]byte]*Hot{}}
	var defaultNode, plansNode, clientsNode *yaml.Node
	p.eachPair(root, "", func(k, v *yaml.Node) {
		switch k.Value {
		case "default_plan":
			defaultNode = v
		case "plans":
			plansNode = v
		case "clients":
			clientsNode = v
		default:
			// Not named: a client's line appended without its
			// indentation lands here, and its name is an API key.
			p.fail(k, "", "unknown top-level field on this line (known: default_plan, plans, clients)")
		}
	})

	if plansNode == nil || isNull(plansNode) {
		p.fail(root, "plans", "required: at least one plan")
	} else {
		p.parsePlans(plansNode, out)
	}
	if defaultNode != nil && !isNull(defaultNode) {
		if name, ok := p.str(defaultNode, "default_plan"); ok {
			out.Default = p.resolve(defaultNode, "default_plan", name, out)
		}
	}
	if clientsNode != nil && !isNull(clientsNode) {
		p.parseClients(clientsNode, out)
	}
	return out
}

func (p *parser) parsePlans(n *yaml.Node, out *Plans) {
	if n.Kind != yaml.MappingNode {
		p.fail(n, "plans", "must be a mapping of plan name to {capacity, rate}, got %s", describe(n))
		return
	}
	if len(n.Content) == 0 {
		p.fail(n, "plans", "required: at least one plan")
		return
	}
	p.eachPair(n, "plans", func(k, v *yaml.Node) {
		name := k.Value
		field := "plans." + name
		if !validName(name) {
			// Not shown: a client's line put under plans: by mistake
			// lands here, and its name is an API key.
			p.fail(k, "plans", "plan name must be 1 to %d characters of A-Z a-z 0-9 . _ -, got %d characters (not shown: it may be an API key)", MaxNameLen, len(name))
			return
		}
		p.declared[name] = true
		if plan := p.parsePlan(v, field); plan != nil {
			plan.Name = name
			out.ByName[name] = plan
		}
	})
}

// parsePlan reads the plan at field ("plans.NAME"). An entry that is not a
// plan's mapping, or has fields a plan has not, is reported by its line
// only, neither its name nor its fields shown: a client's line put under
// plans: by mistake is one ("KEY": pro, or "KEY": {plan: pro, regions:
// [...]}), and its name an API key.
func (p *parser) parsePlan(n *yaml.Node, field string) *Plan {
	if n.Kind != yaml.MappingNode {
		p.fail(n, "plans", "the plan on this line must be a mapping {capacity: N, rate: R}, got %s", describeSecret(n))
		return nil
	}
	var capNode, rateNode *yaml.Node
	unknown := false
	p.eachPair(n, field, func(k, v *yaml.Node) {
		switch k.Value {
		case "capacity":
			capNode = v
		case "rate":
			rateNode = v
		default:
			unknown = true
			p.fail(k, "plans", "unknown field on this line (known: capacity, rate)")
		}
	})
	if unknown {
		return nil
	}
	errsBefore := len(p.errs)
	plan := &Plan{}
	if capNode == nil {
		p.fail(n, field+".capacity", "required")
	} else if c, ok := p.number(capNode, field+".capacity"); ok {
		if c < 1 || c > MaxCapacity || c != math.Trunc(c) {
			p.fail(capNode, field+".capacity", "must be a whole number from 1 to %d, got %s", MaxCapacity, capNode.Value)
		}
		plan.Capacity = c
	}
	if rateNode == nil {
		p.fail(n, field+".rate", "required")
	} else if rateNode.Kind == yaml.ScalarNode && rateNode.Tag == "!!str" {
		if r, err := ParseRate(rateNode.Value); err != nil {
			p.fail(rateNode, field+".rate", "%v", err)
		} else {
			plan.Rate = r
		}
	} else if r, ok := p.number(rateNode, field+".rate"); ok {
		if !(r > 0) || r > MaxRate {
			p.fail(rateNode, field+".rate", "must be a number of tokens per second > 0 and <= %d, got %s", MaxRate, rateNode.Value)
		}
		plan.Rate = r
	}
	if len(p.errs) > errsBefore {
		return nil
	}
	// The bucket's Redis key expires once it would be full again; bound that
	// time so a typo such as rate: 0.0000001 cannot pin keys for decades.
	if refill := plan.Capacity / plan.Rate; refill > MaxRefillSecs {
		at := rateNode.Value + "/s"
		if rateNode.Tag == "!!str" {
			at = strconv.Quote(rateNode.Value)
		}
		// Whole seconds, but for a refill of more digits than anyone
		// reads (1 token at 1e-300/s): three significant ones.
		took := strconv.FormatFloat(refill, 'f', 0, 64)
		if refill >= 1e15 {
			took = strconv.FormatFloat(refill, 'g', 3, 64)
		}
		p.fail(rateNode, field+".rate", "refilling %s tokens at %s takes %s s, more than the %d s (365 days) allowed; raise the rate",
			capNode.Value, at, took, MaxRefillSecs)
		return nil
	}
	plan.LimitHeader = strconv.FormatFloat(plan.Capacity, 'f', -1, 64)
	return plan
}

func (p *parser) parseClients(n *yaml.Node, out *Plans) {
	if n.Kind != yaml.MappingNode {
		p.fail(n, "clients", "must be a mapping of API key to plan name, got %s", describeSecret(n))
		return
	}
	// Keys are secrets: errors below point at the line, never quote the key.
	p.eachPair(n, "clients", func(k, v *yaml.Node) {
		c := client{key: k.Value}
		if kind, digits, ok := strings.Cut(k.Value, ":"); ok && (kind == keys.KindSHA256 || kind == keys.KindHMACSHA256) {
			sum, ok := parseDigest(digits)
			if !ok {
				// A digest in capitals is no secret: quote it. Anything
				// else after the prefix may be a key, hex ones included:
				// say only how long it is.
				got := strconv.Quote(k.Value)
				if !anyCaseDigest.MatchString(digits) {
					got = strconv.Itoa(len(digits)) + " characters (not shown: it may be an API key)"
				}
				p.fail(k, "clients", "a %s: digest must be followed by 64 lowercase hex digits, got %s", kind, got)
				return
			}
			if out.DigestKind == "" {
				out.DigestKind, p.digestLine = kind, k.Line
			} else if kind != out.DigestKind {
				p.fail(k, "clients", "a %s: digest in a file that lists %s: digests (line %d); a sidecar computes one kind, list every client the same way",
					kind, out.DigestKind, p.digestLine)
				return
			}
			c = client{sum: sum, digest: true}
		} else if err := keys.Check([]byte(k.Value)); err != nil {
			p.fail(k, "clients", "the API key on this line is not acceptable: %v", err)
			return
		} else {
			c.sum = sha256.Sum256([]byte(k.Value))
		}
		// One client listed by key and by its sha256: digest would be
		// ambiguous. (An hmac-sha256: digest cannot be matched to a key
		// without the salt; the key's own entry wins there.)
		if !c.digest || out.DigestKind == keys.KindSHA256 {
			if line, dup := p.sums[c.sum]; dup {
				p.fail(k, "clients", "this client is listed twice, by API key and by its sha256: digest (first on line %d)", line)
				return
			}
			p.sums[c.sum] = k.Line
		}
		if v.Kind == yaml.MappingNode {
			p.parseHotClient(c, v, out)
			return
		}
		name, ok := p.str(v, "clients")
		if !ok {
			return
		}
		if !p.declared[name] && p.declared[k.Value] {
			// A key that is a plan's name, and a value that is none: the
			// line is most likely "plan: API key", the value the key.
			p.fail(v, "clients", "no plan named by the value on this line, whose key is the plan %q: are the key and the plan swapped? (the value is not shown: it may be an API key)", k.Value)
			return
		}
		if plan := p.resolve(v, "clients", name, out); plan != nil {
			c.set(out, plan, nil)
		}
	})
}

// client is one entry of the clients section: an API key, or a digest.
type client struct {
	key    string
	sum    [sha256.Size]byte
	digest bool
}

func (c client) set(out *Plans, plan *Plan, hot *Hot) {
	if c.digest {
		out.byDigest[c.sum] = plan
		if hot != nil {
			out.hotDigest[c.sum] = hot
		}
		return
	}
	out.clients[c.key] = plan
	if hot != nil {
		out.hot[c.key] = hot
	}
}

var (
	hexDigits     = regexp.MustCompile(`^[0-9a-f]{64}$`)
	anyCaseDigest = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
)

func parseDigest(digits string) ([sha256.Size]byte, bool) {
	var sum [sha256.Size]byte
	if !hexDigits.MatchString(digits) {
		return sum, false
	}
	_, err := hex.Decode(sum[:], []byte(digits))
	return sum, err == nil
}

// parseHotClient reads a client given as {plan: NAME, regions: [R1, R2, ...]}.
func (p *parser) parseHotClient(c client, n *yaml.Node, out *Plans) {
	var planNode, regionsNode *yaml.Node
	p.eachPair(n, "clients", func(k, v *yaml.Node) {
		switch k.Value {
		case "plan":
			planNode = v
		case "regions":
			regionsNode = v
		default:
			// Not named: the next client's line, indented one level too
			// deep, is a field of this one, and its name an API key.
			p.fail(k, "clients", "unknown field on this line (known: plan, regions)")
		}
	})
	var plan *Plan
	if planNode == nil {
		p.fail(n, "clients.plan", "required")
	} else if name, ok := p.str(planNode, "clients.plan"); ok {
		plan = p.resolve(planNode, "clients.plan", name, out)
	}
	regions := p.regions(n, regionsNode)
	// Each region's bucket holds its share of the capacity, and at equal
	// shares (where they start, and stay for traffic spread evenly) a plan
	// of fewer tokens than regions leaves every bucket short of one token:
	// every check would be answered that it can never succeed. The largest
	// share is never below 1/k, so k tokens are enough for a cost of 1.
	if plan != nil && regions != nil && plan.Capacity < float64(len(regions)) {
		p.fail(regionsNode, "clients.regions", "plan %q holds %s tokens, fewer than the %d regions listed: at equal shares no region's bucket could hold one token, and every request would be refused as one that can never succeed; list at most %s regions or give the client a plan of at least %d tokens",
			plan.Name, plan.LimitHeader, len(regions), plan.LimitHeader, len(regions))
		return
	}
	if plan != nil && regions != nil {
		c.set(out, plan, &Hot{Regions: regions})
	}
}

func (p *parser) regions(parent, n *yaml.Node) []string {
	const field = "clients.regions"
	if n == nil {
		p.fail(parent, field, "required: a list of %d to %d region names", MinRegions, MaxRegions)
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.fail(n, field, "must be a list of %d to %d region names, got %s", MinRegions, MaxRegions, describe(n))
		return nil
	}
	if len(n.Content) < MinRegions || len(n.Content) > MaxRegions {
		p.fail(n, field, "must list %d to %d regions, got %d", MinRegions, MaxRegions, len(n.Content))
		return nil
	}
	var out []string
	seen := map[string]bool{}
	ok := true
	for _, r := range n.Content {
		r = deref(r)
		if r.Kind != yaml.ScalarNode || r.Tag != "!!str" || !validName(r.Value) {
			p.fail(r, field, "a region must be 1 to %d characters of A-Z a-z 0-9 . _ -, got %s", MaxNameLen, describe(r))
			ok = false
			continue
		}
		if seen[r.Value] {
			p.fail(r, field, "region %q is listed twice", r.Value)
			ok = false
			continue
		}
		seen[r.Value] = true
		out = append(out, r.Value)
	}
	if !ok {
		return nil
	}
	return out
}

// eachPair calls f for each key/value of mapping n, rejecting non-scalar and
// duplicate keys. A duplicate is an error rather than "last one wins" because
// a silently ignored line in a limits file is a limit nobody enforces.
func (p *parser) eachPair(n *yaml.Node, field string, f func(k, v *yaml.Node)) {
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			p.fail(k, field, "keys must be plain strings, got %s", describe(k))
			continue
		}
		if line, dup := seen[k.Value]; dup {
			what := strconv.Quote(k.Value)
			if field == "clients" {
				what = "an API key"
			}
			p.fail(k, field, "%s is listed twice (first on line %d)", what, line)
			continue
		}
		seen[k.Value] = k.Line
		f(k, v)
	}
}

func (p *parser) number(n *yaml.Node, field string) (float64, bool) {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
		p.fail(n, field, "must be a number, got %s", describe(n))
		return 0, false
	}
	var f float64
	if err := n.Decode(&f); err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		p.fail(n, field, "must be a finite number, got %s", n.Value)
		return 0, false
	}
	return f, true
}

func (p *parser) str(n *yaml.Node, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!str" && n.Tag != "!!int") {
		p.fail(n, field, "must be a plan name, got %s", describe(n))
		return "", false
	}
	return n.Value, true
}

// deref follows an alias (*anchor) to the node it names. Aliases are not
// expanded recursively, so a file cannot blow up in memory through them.
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 8; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// describe says what a node is, for "got ..." in errors.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return "nothing (null)"
		case "!!str":
			return "string " + strconv.Quote(n.Value)
		}
		return n.Value
	}
	return "an unsupported YAML node"
}

// describeSecret says what a node is, as describe does, without the text of
// a scalar, which in the clients section may be an API key.
func describeSecret(n *yaml.Node) string {
	switch {
	case n.Kind != yaml.ScalarNode || n.Tag == "!!null":
		return describe(n)
	case n.Tag == "!!str":
		return "a string (not shown: it may be an API key)"
	}
	return "a single value (not shown: it may be an API key)"
}

// validName reports whether s names a plan or a hot client's region: the
// rule of the regions the filter sends (region.Valid), and not empty.
func validName(s string) bool {
	return s != "" && region.Valid(s)
}

func known(declared map[string]bool) string {
	if len(declared) == 0 {
		return ""
	}
	names := make([]string, 0, len(declared))
	for n := range declared {
		names = append(names, n)
	}
	slices.Sort(names)
	return " (plans: " + strings.Join(names, ", ") + ")"
}
