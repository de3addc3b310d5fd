package configfile

import (
	"cmp"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
	"github.com/ratelimit-authz/ratelimit-authz/internal/problem"
)

// The configuration grammar, as Parse reads it (YAML; an unknown or
// repeated field anywhere is a problem; every problem carries its line and
// column):
//
//	config   = { keys, counter, failures, buckets (required), routes (required), quota }
//	keys     = { tenant_header: header-name        (default x-tenant-id)
//	             account_header: header-name       (none)
//	             account_body_field: field-name    (none)
//	             trusted_hops: 0 … 16              (0; = Envoy's xff_num_trusted_hops)
//	             use_external_address_header: bool (true)
//	             ipv6_prefix: 32 … 128             (64)
//	             unreadable_account: shared_key | deny (shared_key) }
//	counter  = { max_keys: 1 … 2^30 (1000000), max_key_bytes: 16 … 4096 (128),
//	             shards: 1 … 4096 (64), reserved_keys: 1 … max_keys−1 (max_keys/10) }
//	failures = { status_codes: [ 100 … 599, … ] (default [401]) }
//	buckets  = { bucket-name: bucket, … }          (at least one)
//	bucket   = { limit: 1 … 2^31−1, per: window,   (both or neither: neither takes
//	             algorithm: fixed | sliding,        a route default or a built-in one)
//	             key: tenant | ip | account | path:<param> | header:<lowercase-name>,
//	             mode: enforce | shadow, count: requests | failures | concurrency,
//	             cost: cost (none: 1 a request, or the route's costs),
//	             lease_ttl: 1s … 24h (1m; count: concurrency only),
//	             overridable: bool, on_missing_key: allow | deny,
//	             on_overflow: allow | deny (deny for count: failures) }
//	           (count: concurrency limits requests in flight: a limit and no
//	           per, algorithm or cost, no route default, no on_overflow: a
//	           full lease table denies)
//	cost     = content_length | response_bytes
//	           | { request_header: header-name | response_header: header-name
//	               | response_trailer: header-name | content_length: true
//	               | response_bytes: true,           (exactly one)
//	               max: 1 … 2^31−1 (2^31−1),
//	               missing: 0 … max (request-time: none = refused; response-time: 0) }
//	           (not with count: failures; see Cost.Request and Cost.Response
//	           for what a hostile value does)
//	window   = Go duration of whole milliseconds, at most 2^31−1 ms (500ms, 1s, 1m, 1h)
//	           | a unit in any case: 1s, s, sec, second, 1m, m, min, minute, 1h, h, hour, 1d, d, day
//	           (limits.ParseWindow, the one grammar; overrides take a subset)
//	routes   = [ route, … ]                         (at least one)
//	route    = { name: unique string, method: uppercase letters (GET, POST, …),
//	             path: template | paths: [ template, … ], buckets: [ bucket-name, … ],
//	             defaults: { bucket-name: { limit, per, algorithm }, … },
//	             costs: { bucket-name: 1 … 2^31−1, … } }  (a constant cost of a
//	             bucket of this route without a cost of its own)
//	template = /segment/… where a segment may be {param}
//	quota    = { domains: [ domain, … ] (required),  (Envoy RLQS; see Quota)
//	             assignment_ttl: 1s … 24h (5s), abandon_after: 1s … 24h (1m),
//	             unmatched: allow | deny (allow),
//	             max_streams: 1 … 2^20 (256), max_bucket_ids: 1 … 2^20 (1024, per stream),
//	             buckets: [ { match: { entry: value, … }, bucket: bucket-name,
//	                          key: entry }, … ] (required) }
//	             (entry is [A-Za-z0-9_.-]{1,63}; a value 1 … 256 bytes; the bucket
//	             counts requests, is keyed by tenant, path:<param> or header:<name>
//	             and has a limit; no two entries match the same bucket ids)
//
// bucket-name is [a-z][a-z0-9_]{0,62} (match.ValidBucketName);
// header names are lowercase tokens, or a pseudo-header such as :authority
// (match.HeaderNameProblem); param is [A-Za-z_][A-Za-z0-9_]*
// (match.ValidParamName); a method is A–Z only
// (match.ValidMethod); two routes with the same method and the same
// template shape are one route given twice (match.RouteKey);
// a route default is the bucket's limit on every route (one per bucket,
// and none for a bucket with its own limit), since a client picks the route
// by its path. The shipped config/ratelimit.yaml and docs/configuration.md
// show each field in use.

// LoadFile reads and parses a configuration file.
func LoadFile(path string) (*Rules, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("rules: read config: %w", err)
	}
	return Parse(data, path)
}

// Parse parses and validates a configuration. On any problem it returns a
// nil *Rules and a problem.List error listing all of them.
func Parse(data []byte, file string) (*Rules, error) {
	p := &parser{file: file}
	r := p.parse(data)
	if len(p.problems) > 0 {
		return nil, p.problems
	}
	return r, nil
}

type parser struct {
	file     string
	problems problem.List
	// broken buckets already have a problem reported; checks that follow
	// from it (no limit, say) would only repeat it.
	broken map[int]bool
}

func (p *parser) errorf(n *yaml.Node, format string, args ...any) {
	pr := problem.Problem{File: p.file, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		pr.Line, pr.Column = n.Line, n.Column
	}
	p.problems = append(p.problems, pr)
}

var (
	fieldName = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)
)

func (p *parser) parse(data []byte) *Rules {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		p.problems = append(p.problems, problem.Problem{File: p.file, Msg: yamlError(err)})
		return nil
	}
	r := &Rules{Keys: Keys{
		TenantHeader:             "x-tenant-id",
		UseExternalAddressHeader: true,
		IPv6Prefix:               64,
	}}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		p.errorf(nil, "the configuration is empty: it needs buckets and routes")
		return r
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		p.errorf(top, "the configuration must be a mapping with keys, counter, buckets and routes")
		return r
	}
	var bucketsNode, routesNode, quotaNode *yaml.Node
	p.eachKey(top, "top level", []string{"keys", "counter", "failures", "buckets", "routes", "quota"}, func(k string, kn, v *yaml.Node) {
		switch k {
		case "quota":
			quotaNode = v
		case "failures":
			p.parseFailures(v, &r.Failures)
		case "keys":
			p.parseKeys(v, &r.Keys)
		case "counter":
			p.parseCounter(v, &r.Counter)
		case "buckets":
			bucketsNode = v
		case "routes":
			routesNode = v
		}
	})
	if bucketsNode == nil {
		p.errorf(top, "no buckets: the configuration needs at least one bucket")
	} else {
		p.parseBuckets(bucketsNode, r)
	}
	if routesNode == nil {
		p.errorf(top, "no routes: the configuration needs at least one route")
	} else {
		p.parseRoutes(routesNode, r)
	}
	if len(r.Failures.StatusCodes) == 0 {
		r.Failures.StatusCodes = []uint32{401}
	}
	p.crossCheck(r)
	if quotaNode != nil && bucketsNode != nil {
		p.parseQuota(quotaNode, r) // after crossCheck: it reads the buckets' resolved limits
	}
	if len(p.problems) == 0 {
		p.checkMatcher(r, routesNode)
	}
	return r
}

// checkMatcher compiles the matcher of r, kept for Rules.Matcher: it has
// its own checks, and anything it still refuses is a problem of the file
// as a whole, reported at routesNode.
func (p *parser) checkMatcher(r *Rules, routesNode *yaml.Node) {
	m, err := match.New(r.Descriptors())
	if err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			p.errorf(routesNode, "%s", line)
		}
		return
	}
	r.matcher = m
}

// yamlError strips the library prefix; its messages already carry "line N".
func yamlError(err error) string {
	return "invalid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")
}

// eachKey walks a mapping, reporting unknown and repeated keys.
func (p *parser) eachKey(n *yaml.Node, what string, allowed []string, fn func(k string, kn, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		p.errorf(n, "%s must be a mapping", what)
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, v := n.Content[i], n.Content[i+1]
		k := kn.Value
		if seen[k] {
			p.errorf(kn, "%s: %q given twice", what, k)
			continue
		}
		seen[k] = true
		if allowed != nil && !slices.Contains(allowed, k) {
			p.errorf(kn, "%s: unknown field %q (known: %s)", what, k, strings.Join(allowed, ", "))
			continue
		}
		fn(k, kn, v)
	}
}

func (p *parser) str(n *yaml.Node, what string) (string, bool) {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!str" && n.Tag != "!!int" && n.Tag != "!!float" && n.Tag != "!!bool") {
		p.errorf(n, "%s must be a string", what)
		return "", false
	}
	return n.Value, true
}

func (p *parser) integer(n *yaml.Node, what string, min, max int64) (int64, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		p.errorf(n, "%s must be a whole number, not %q", what, n.Value)
		return 0, false
	}
	v, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
	if err != nil || v < min || v > max {
		p.errorf(n, "%s must be between %d and %d, not %s", what, min, max, n.Value)
		return 0, false
	}
	return v, true
}

func (p *parser) boolean(n *yaml.Node, what string) (bool, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
		p.errorf(n, "%s must be true or false, not %q", what, n.Value)
		return false, false
	}
	return n.Value == "true", true
}

func (p *parser) enum(n *yaml.Node, what string, values ...string) (int, bool) {
	s, ok := p.str(n, what)
	if !ok {
		return 0, false
	}
	if i := slices.Index(values, s); i >= 0 {
		return i, true
	}
	p.errorf(n, "%s must be one of %s, not %q", what, strings.Join(values, ", "), s)
	return 0, false
}

func (p *parser) parseKeys(n *yaml.Node, k *Keys) {
	p.eachKey(n, "keys", []string{"tenant_header", "account_header", "account_body_field", "trusted_hops", "use_external_address_header", "ipv6_prefix", "unreadable_account"}, func(key string, _, v *yaml.Node) {
		switch key {
		case "tenant_header", "account_header":
			s, ok := p.str(v, "keys."+key)
			if !ok {
				return
			}
			if s != "" && match.HeaderNameProblem(s) != "" {
				p.errorf(v, "keys.%s: %q is not a lowercase header name", key, s)
				return
			}
			if key == "tenant_header" {
				k.TenantHeader = s
			} else {
				k.AccountHeader = s
			}
		case "account_body_field":
			s, ok := p.str(v, "keys."+key)
			if ok && s != "" && !fieldName.MatchString(s) {
				p.errorf(v, "keys.account_body_field: %q is not a plain field name", s)
				return
			}
			k.AccountBodyField = s
		case "trusted_hops":
			if v, ok := p.integer(v, "keys.trusted_hops", 0, 16); ok {
				k.TrustedHops = int(v)
			}
		case "use_external_address_header":
			if b, ok := p.boolean(v, "keys."+key); ok {
				k.UseExternalAddressHeader = b
			}
		case "ipv6_prefix":
			// Below /32 one key would span whole providers.
			if v, ok := p.integer(v, "keys.ipv6_prefix", 32, 128); ok {
				k.IPv6Prefix = int(v)
			}
		case "unreadable_account":
			if i, ok := p.enum(v, "keys.unreadable_account", "shared_key", "deny"); ok {
				k.UnreadableAccount = AccountPolicy(i)
			}
		}
	})
}

func (p *parser) parseCounter(n *yaml.Node, c *counter.Config) {
	p.eachKey(n, "counter", []string{"max_keys", "max_key_bytes", "shards", "reserved_keys"}, func(key string, _, v *yaml.Node) {
		switch key {
		case "reserved_keys":
			if x, ok := p.integer(v, "counter.reserved_keys", 1, 1<<30); ok {
				c.ReservedKeys = int(x)
			}
		case "max_keys":
			if x, ok := p.integer(v, "counter.max_keys", 1, 1<<30); ok {
				c.MaxKeys = int(x)
			}
		case "max_key_bytes":
			if x, ok := p.integer(v, "counter.max_key_bytes", 16, 4096); ok {
				c.MaxKeyBytes = int(x)
			}
		case "shards":
			if x, ok := p.integer(v, "counter.shards", 1, 4096); ok {
				c.Shards = int(x)
			}
		}
	})
	if maxKeys := cmp.Or(c.MaxKeys, counter.DefaultMaxKeys); c.ReservedKeys >= maxKeys {
		p.errorf(n, "counter.reserved_keys %d must be below counter.max_keys %d", c.ReservedKeys, maxKeys)
	}
}

func (p *parser) parseFailures(n *yaml.Node, f *Failures) {
	p.eachKey(n, "failures", []string{"status_codes"}, func(_ string, _, v *yaml.Node) {
		if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
			p.errorf(v, "failures.status_codes must be a non-empty list of HTTP status codes")
			return
		}
		for _, cn := range v.Content {
			if c, ok := p.integer(cn, "failures.status_codes", 100, 599); ok && !slices.Contains(f.StatusCodes, uint32(c)) {
				f.StatusCodes = append(f.StatusCodes, uint32(c))
			}
		}
	})
}

// limitFields parses limit/per/algorithm from a bucket or a route default.
func (p *parser) limitField(key string, v *yaml.Node, what string, l *counter.Limit) {
	switch key {
	case "limit":
		if x, ok := p.integer(v, what+".limit", 1, counter.MaxLimit); ok {
			l.Limit = x
		}
	case "per":
		s, ok := p.str(v, what+".per")
		if !ok {
			return
		}
		ms, err := limits.ParseWindow(s)
		if err != nil {
			p.errorf(v, "%s.per: %v", what, err)
			return
		}
		l.ScaleMS = ms
	case "algorithm":
		if i, ok := p.enum(v, what+".algorithm", "fixed", "sliding"); ok {
			l.Algorithm = counter.Algorithm(i)
		}
	}
}

func (p *parser) parseKeySpec(v *yaml.Node, what string) (match.KeySpec, bool) {
	s, ok := p.str(v, what)
	if !ok {
		return match.KeySpec{}, false
	}
	switch {
	case s == "tenant":
		return match.KeySpec{Kind: match.KeyTenant}, true
	case s == "ip":
		return match.KeySpec{Kind: match.KeyIP}, true
	case s == "account":
		return match.KeySpec{Kind: match.KeyAccount}, true
	case strings.HasPrefix(s, "path:") && match.ValidParamName(s[5:]):
		return match.KeySpec{Kind: match.KeyPathParam, Name: s[5:]}, true
	case strings.HasPrefix(s, "header:") && match.HeaderNameProblem(s[7:]) == "":
		return match.KeySpec{Kind: match.KeyHeader, Name: s[7:]}, true
	}
	p.errorf(v, "%s: %q is not a key (tenant, ip, account, path:<param>, header:<lowercase-name>)", what, s)
	return match.KeySpec{}, false
}

// bucketFieldNames are the fields a bucket may have.
var bucketFieldNames = []string{"limit", "per", "algorithm", "key", "mode", "count", "cost", "lease_ttl", "overridable", "on_missing_key", "on_overflow"}

func (p *parser) parseBuckets(n *yaml.Node, r *Rules) {
	p.eachKey(n, "buckets", nil, func(name string, kn, v *yaml.Node) {
		p.parseBucket(name, kn, v, r)
	})
	if n.Kind == yaml.MappingNode && len(n.Content) == 0 {
		p.errorf(n, "buckets is empty")
	}
}

// bucketSeen records which of a bucket's fields were given, and where,
// for the checks of the bucket as a whole.
type bucketSeen struct {
	hasKey, hasLimit, hasPer, hasOverflow       bool
	costNode, windowNode, ttlNode, overflowNode *yaml.Node
}

// parseBucket reads the bucket name: v, checks it as a whole and appends
// it to r.Buckets, marked broken when any of this reports a problem.
func (p *parser) parseBucket(name string, kn, v *yaml.Node, r *Rules) {
	what := "buckets." + name
	if !match.ValidBucketName(name) {
		p.errorf(kn, "bucket name %q must be lowercase letters, digits and _ (starting with a letter, at most 63)", name)
	}
	b := Bucket{Name: name}
	before := len(p.problems)
	var seen bucketSeen
	p.eachKey(v, what, bucketFieldNames, func(key string, kn, fv *yaml.Node) {
		p.bucketField(key, kn, fv, what, &b, &seen)
	})
	p.checkBucket(&b, what, kn, v, &seen)
	b.HasLimit = b.Limit.Limit > 0 && b.Limit.ScaleMS > 0
	if len(p.problems) > before {
		if p.broken == nil {
			p.broken = map[int]bool{}
		}
		p.broken[len(r.Buckets)] = true
	}
	r.Buckets = append(r.Buckets, b)
}

// bucketField sets the field key (at kn, value fv) of bucket b and
// records in seen that it was given.
func (p *parser) bucketField(key string, kn, fv *yaml.Node, what string, b *Bucket, seen *bucketSeen) {
	switch key {
	case "limit", "per", "algorithm":
		p.limitField(key, fv, what, &b.Limit)
		seen.hasLimit = seen.hasLimit || key == "limit"
		seen.hasPer = seen.hasPer || key == "per"
		if key != "limit" {
			seen.windowNode = kn
		}
	case "lease_ttl":
		seen.ttlNode = kn
		b.LeaseTTL, _ = p.duration(fv, what+".lease_ttl", time.Second, limits.MaxLeaseTTL)
	case "key":
		b.Key, seen.hasKey = p.parseKeySpec(fv, what+".key")
	case "mode":
		if i, ok := p.enum(fv, what+".mode", "enforce", "shadow"); ok {
			b.Shadow = i == 1
		}
	case "count":
		if i, ok := p.enum(fv, what+".count", "requests", "failures", "concurrency"); ok {
			b.Count = Counting(i)
		}
	case "cost":
		seen.costNode = fv
		b.Cost, _ = p.parseCost(fv, what+".cost")
	case "overridable":
		b.Overridable, _ = p.boolean(fv, what+".overridable")
	case "on_missing_key":
		if i, ok := p.enum(fv, what+".on_missing_key", "allow", "deny"); ok {
			b.OnMissingKey = Action(i)
		}
	case "on_overflow":
		if i, ok := p.enum(fv, what+".on_overflow", "allow", "deny"); ok {
			b.OnOverflow = Action(i)
			seen.hasOverflow = true
		}
		seen.overflowNode = kn
	}
}

// checkBucket checks bucket b (named at kn, its mapping v) as a whole
// once its fields are read, and completes what its count implies.
func (p *parser) checkBucket(b *Bucket, what string, kn, v *yaml.Node, seen *bucketSeen) {
	if b.Count == CountConcurrency {
		if seen.costNode != nil {
			p.errorf(seen.costNode, "%s: count: concurrency counts requests in flight; a cost is for a bucket counting requests", what)
		}
		p.concurrencyBucket(b, what, kn, seen.hasLimit, seen.windowNode, seen.overflowNode)
		seen.hasPer = seen.hasLimit // a concurrency limit has no window
	} else if seen.ttlNode != nil {
		p.errorf(seen.ttlNode, "%s.lease_ttl: only a bucket with count: concurrency has leases", what)
	}
	if b.Count == CountFailures {
		if seen.costNode != nil {
			p.errorf(seen.costNode, "%s: count: failures charges 1 per failure; a cost is for a bucket counting requests", what)
		}
		b.Cost = Cost{Source: CostFailures}
		if !seen.hasOverflow {
			b.OnOverflow = Deny
		}
	}
	if !seen.hasKey && v.Kind == yaml.MappingNode {
		p.errorf(kn, "%s: no key (tenant, ip, account, path:<param>, header:<name>)", what)
	}
	if seen.hasLimit != seen.hasPer {
		p.errorf(kn, "%s: give both limit and per, or neither", what)
	}
}

// routeFieldNames are the fields a route may have.
var routeFieldNames = []string{"name", "method", "path", "paths", "buckets", "defaults", "costs"}

func (p *parser) parseRoutes(n *yaml.Node, r *Rules) {
	if n.Kind != yaml.SequenceNode {
		p.errorf(n, "routes must be a list")
		return
	}
	if len(n.Content) == 0 {
		p.errorf(n, "routes is empty")
	}
	names := map[string]bool{}
	for i, rn := range n.Content {
		p.parseRoute(fmt.Sprintf("routes[%d]", i), rn, r, names)
	}
}

// routeSpec is one entry of routes as read: one Route per path.
type routeSpec struct {
	name, method string
	paths        []*yaml.Node
	buckets      []int
	defaults     map[int]counter.Limit
	costs        map[int]int64
	costsNode    *yaml.Node
	sawBuckets   bool
}

// parseRoute reads the route rn, checks it and appends a Route per path
// to r.Routes. names holds the route names given so far.
func (p *parser) parseRoute(what string, rn *yaml.Node, r *Rules, names map[string]bool) {
	var s routeSpec
	p.eachKey(rn, what, routeFieldNames, func(key string, _, v *yaml.Node) {
		p.routeField(key, v, what, r, names, &s)
	})
	if rn.Kind != yaml.MappingNode {
		return
	}
	p.checkRoute(rn, what, &s, r)
	p.addRoutes(what, &s, r)
}

// routeField reads the field key (value v) of a route into s.
func (p *parser) routeField(key string, v *yaml.Node, what string, r *Rules, names map[string]bool, s *routeSpec) {
	switch key {
	case "name":
		s.name, _ = p.str(v, what+".name")
		if names[s.name] {
			p.errorf(v, "%s: route name %q is used twice", what, s.name)
		}
		names[s.name] = true
	case "method":
		m, ok := p.str(v, what+".method")
		if ok && (m == "" || !match.ValidMethod(m)) {
			p.errorf(v, "%s.method: %q is not an uppercase HTTP method", what, m)
		}
		s.method = m
	case "path":
		s.paths = append(s.paths, v)
	case "paths":
		if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
			p.errorf(v, "%s.paths must be a non-empty list", what)
			return
		}
		s.paths = append(s.paths, v.Content...)
	case "buckets":
		s.sawBuckets = true
		s.buckets = p.bucketRefs(v, what+".buckets", r)
	case "defaults":
		s.defaults = p.routeDefaults(v, what+".defaults", r)
	case "costs":
		s.costs, s.costsNode = p.routeCosts(v, what+".costs", r), v
	}
}

// checkRoute checks that the route rn has paths and buckets, and that
// its defaults and costs are of its own buckets.
func (p *parser) checkRoute(rn *yaml.Node, what string, s *routeSpec, r *Rules) {
	if len(s.paths) == 0 {
		p.errorf(rn, "%s: no path", what)
	}
	if !s.sawBuckets {
		p.errorf(rn, "%s: no buckets", what)
	}
	for b := range s.defaults {
		if !slices.Contains(s.buckets, b) {
			p.errorf(rn, "%s.defaults: bucket %q is not in this route's buckets", what, r.Buckets[b].Name)
		}
	}
	for b := range s.costs {
		if !slices.Contains(s.buckets, b) {
			p.errorf(s.costsNode, "%s.costs: bucket %q is not in this route's buckets", what, r.Buckets[b].Name)
		}
	}
}

// addRoutes appends to r.Routes one Route per valid path of s.
func (p *parser) addRoutes(what string, s *routeSpec, r *Rules) {
	for _, pn := range s.paths {
		path, ok := p.str(pn, what+".path")
		if !ok {
			continue
		}
		if err := match.ValidateTemplate(path); err != nil {
			p.errorf(pn, "%s: path %q can never match: %v", what, path, err)
			continue
		}
		r.Routes = append(r.Routes, Route{
			Name: s.name, Method: s.method, Path: path, Buckets: s.buckets,
			Defaults: s.defaults, Costs: s.costs, Line: pn.Line,
		})
	}
}

func (p *parser) bucketRefs(v *yaml.Node, what string, r *Rules) []int {
	if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
		p.errorf(v, "%s must be a non-empty list of bucket names", what)
		return nil
	}
	var out []int
	for _, bn := range v.Content {
		name, ok := p.str(bn, what)
		if !ok {
			continue
		}
		b := r.BucketIndex(name)
		switch {
		case b < 0:
			p.errorf(bn, "%s: unknown bucket %q (known: %s)", what, name, bucketNames(r))
		case slices.Contains(out, b):
			p.errorf(bn, "%s: bucket %q named twice", what, name)
		default:
			out = append(out, b)
		}
	}
	return out
}

func (p *parser) routeDefaults(v *yaml.Node, what string, r *Rules) map[int]counter.Limit {
	out := map[int]counter.Limit{}
	p.eachKey(v, what, nil, func(name string, kn, lv *yaml.Node) {
		b := r.BucketIndex(name)
		if b < 0 {
			p.errorf(kn, "%s: unknown bucket %q (known: %s)", what, name, bucketNames(r))
			return
		}
		var l counter.Limit
		p.eachKey(lv, what+"."+name, []string{"limit", "per", "algorithm"}, func(key string, _, fv *yaml.Node) {
			p.limitField(key, fv, what+"."+name, &l)
		})
		if l.Limit == 0 || l.ScaleMS == 0 {
			p.errorf(kn, "%s.%s: a route default needs both limit and per", what, name)
			return
		}
		out[b] = l
	})
	return out
}

// routeCosts reads a route's constant costs: bucket-name: 1 … 2^31−1,
// each of a bucket that counts requests without a cost of its own.
func (p *parser) routeCosts(v *yaml.Node, what string, r *Rules) map[int]int64 {
	out := map[int]int64{}
	p.eachKey(v, what, nil, func(name string, kn, cn *yaml.Node) {
		b := r.BucketIndex(name)
		if b < 0 {
			p.errorf(kn, "%s: unknown bucket %q (known: %s)", what, name, bucketNames(r))
			return
		}
		if src := r.Buckets[b].Cost.Source; src != CostRequests {
			p.errorf(kn, "%s: bucket %q costs %s, not a constant per request", what, name, r.Buckets[b].Cost)
			return
		}
		if r.Buckets[b].Count == CountConcurrency {
			p.errorf(kn, "%s: bucket %q counts requests in flight: one each, no cost", what, name)
			return
		}
		if n, ok := p.integer(cn, what+"."+name, 1, MaxCostMax); ok {
			out[b] = n
		}
	})
	if len(out) == 0 {
		return nil
	}
	return out
}

func bucketNames(r *Rules) string {
	names := make([]string, len(r.Buckets))
	for i, b := range r.Buckets {
		names[i] = b.Name
	}
	return strings.Join(names, ", ")
}

// concurrencyBucket checks and completes a bucket with count:
// concurrency: a limit of requests in flight, no window, no overflow
// policy (a full lease table denies), a lease time to live.
func (p *parser) concurrencyBucket(b *Bucket, what string, at *yaml.Node, hasLimit bool, window, overflow *yaml.Node) {
	if !hasLimit {
		p.errorf(at, "%s: count: concurrency needs a limit (requests in flight)", what)
	}
	if window != nil {
		p.errorf(window, "%s: count: concurrency limits requests in flight: no per or algorithm", what)
	}
	if overflow != nil {
		p.errorf(overflow, "%s.on_overflow: count: concurrency always denies when its lease table is full", what)
	}
	if b.Key.Kind == match.KeyAccount {
		p.errorf(at, "%s: count: concurrency is keyed by one key a request; a login's accounts are several", what)
	}
	b.Limit.ScaleMS, b.Limit.Algorithm = limits.ConcurrencyScaleMS, counter.Fixed
	b.OnOverflow = Deny
	if b.LeaseTTL == 0 {
		b.LeaseTTL = limits.DefaultLeaseTTL
	}
}

// crossCheck finds what no single field shows: routes that repeat one
// another, keys a route cannot supply, buckets without a limit.
func (p *parser) crossCheck(r *Rules) {
	p.resolveDefaults(r)
	seen := map[string]int{}
	for _, rt := range r.Routes {
		at := &yaml.Node{Line: rt.Line, Column: 1}
		sk, _ := match.RouteKey(rt.Method, rt.Path)
		if prev, ok := seen[sk]; ok {
			p.errorf(at, "route %s %s repeats the route at line %d (same method and path shape)", methodOrAny(rt.Method), rt.Path, prev)
		} else {
			seen[sk] = rt.Line
		}
		params := match.TemplateParams(rt.Path)
		for _, b := range rt.Buckets {
			bk := r.Buckets[b]
			if bk.Key.Kind == match.KeyPathParam && !slices.Contains(params, bk.Key.Name) {
				p.errorf(at, "route %s %s: bucket %q is keyed by path parameter {%s}, which this path does not capture", methodOrAny(rt.Method), rt.Path, bk.Name, bk.Key.Name)
			}
			if _, ok := bk.Configured(); !ok && !p.broken[b] {
				p.errorf(at, "route %s %s: bucket %q has no limit: give limit and per in the bucket or in this route's defaults", methodOrAny(rt.Method), rt.Path, bk.Name)
			}
		}
	}
	// A bucket no route names is allowed: Envoy may name it in
	// context_extensions.
	for _, b := range r.Buckets {
		if b.Key.Kind == match.KeyTenant && r.Keys.TenantHeader == "" {
			p.errorf(nil, "bucket %q is keyed by tenant but keys.tenant_header is empty", b.Name)
		}
		if b.Key.Kind == match.KeyAccount && r.Keys.AccountHeader == "" && r.Keys.AccountBodyField == "" {
			p.errorf(nil, "bucket %q is keyed by account but neither keys.account_header nor keys.account_body_field is set", b.Name)
		}
	}
}

func methodOrAny(m string) string {
	if m == "" {
		return "(any method)"
	}
	return m
}

// resolveDefaults makes each route default the limit of its bucket, on
// every route. Routes are chosen by the client (by its path), so two
// routes giving one bucket different limits would let a client pick the
// limit of a key other requests share, and reset its count by alternating
// (a counter entry restarts when its window length changes): a problem. A
// default for a bucket with a limit of its own would never apply: also a
// problem, so that the file says what is enforced.
func (p *parser) resolveDefaults(r *Rules) {
	first := map[int]int{} // bucket → index of the first route giving it a default
	for ri, rt := range r.Routes {
		at := &yaml.Node{Line: rt.Line, Column: 1}
		for b, l := range rt.Defaults {
			bk := &r.Buckets[b]
			if bk.HasLimit {
				if _, seen := first[b]; !seen { // once per bucket
					p.errorf(at, "route %s %s: defaults.%s is never used: the bucket has its own limit", methodOrAny(rt.Method), rt.Path, bk.Name)
				}
				first[b] = ri
				continue
			}
			fi, seen := first[b]
			if !seen {
				first[b] = ri
				bk.Default, bk.HasDefault = l, true
				continue
			}
			if bk.Default != l {
				p.errorf(at, "route %s %s: defaults.%s (%s) differs from the default the route at line %d gives it (%s): a client picks the route by its path, so it could pick the limit of keys other requests share; give the bucket its own limit, or one default",
					methodOrAny(rt.Method), rt.Path, bk.Name, limitText(l), r.Routes[fi].Line, limitText(bk.Default))
			}
		}
	}
}

func limitText(l counter.Limit) string {
	alg := "fixed"
	if l.Algorithm == counter.Sliding {
		alg = "sliding"
	}
	return fmt.Sprintf("%d per %v %s", l.Limit, time.Duration(l.ScaleMS)*time.Millisecond, alg)
}
