package rlsconfig

import (
	"cmp"
	"encoding/base64"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
	"github.com/ratelimit-authz/ratelimit-authz/internal/problem"
)

// Bounds on what one Parse accepts, so that a hostile or mistaken file
// costs bounded memory and time. Each is far above any real configuration.
const (
	// MaxFileBytes bounds one file. The YAML tree of a file is built
	// whole before it is checked and costs a large multiple of the file's
	// size when the file is nothing but tiny nodes, so this bound is what
	// bounds the memory of a parse.
	MaxFileBytes = 1 << 20
	// MaxProblems bounds the problems reported; past it one more says so.
	MaxProblems = 100
	// MaxDescriptors bounds the descriptors of all files together.
	MaxDescriptors = 100_000
	// MaxDepth bounds how deep descriptors nest (Envoy sends one entry per
	// level, and no route has dozens of actions).
	MaxDepth = 64
	// maxNodes bounds the YAML nodes visited in one file, each alias
	// counted again where it is used: this is what bounds an alias bomb.
	maxNodes = 1 << 20
	// maxMetadataDepth bounds nesting inside a metadata mapping.
	maxMetadataDepth = 64
	// maxMergeDepth bounds merges (<<) of mappings that merge others.
	maxMergeDepth = 64
)

// Field names, by where they may appear. envoyproxy/ratelimit checks one
// flat list of names anywhere (a misplaced one is silently ignored there);
// here a name in the wrong place is a problem saying where it belongs.
var (
	rootKeys       = []string{"domain", "descriptors"}
	descriptorKeys = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata"}
	rateLimitKeys  = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "overridable", "charge", "count", "lease_ttl"}
	replacesKeys   = []string{"name"}
)

// Parse parses and validates configuration files, each one domain. On any
// problem it returns a nil *Config and a problem.List listing every one
// (file:line:column: upstream's message), files in name order. An invalid
// Options.DefaultAlgorithm is a plain error: the caller's, not the files'.
func Parse(files []File, opts Options) (*Config, error) {
	if opts.DefaultAlgorithm != counter.Fixed && opts.DefaultAlgorithm != counter.Sliding {
		return nil, fmt.Errorf("rlsconfig: unknown default algorithm %d", opts.DefaultAlgorithm)
	}
	sorted := slices.Clone(files)
	slices.SortStableFunc(sorted, func(a, b File) int { return cmp.Compare(a.Name, b.Name) })
	b := &builder{
		opts:        opts,
		cfg:         &Config{byDomain: map[string]*level{}, domainIndex: map[string]int{}},
		overridable: map[string]string{},
		composites:  map[*level]map[string]bool{},
	}
	for _, f := range sorted {
		if b.capped {
			break
		}
		b.file(f)
	}
	if len(b.problems) > 0 {
		return nil, b.problems
	}
	b.finish()
	if len(b.problems) > 0 {
		return nil, b.problems
	}
	return b.cfg, nil
}

type builder struct {
	opts        Options
	cfg         *Config
	problems    problem.List
	descriptors int               // over all files
	overridable map[string]string // rate_limit.name → where first
	// composites holds each level's composite keys (key, or key_value),
	// upstream's identity of a descriptor among its siblings.
	composites map[*level]map[string]bool
	// tenantShared: the first level of the descriptor being read shares
	// one counter among every value its wildcard matches (share_threshold),
	// so the tenant, that level's value, is not in the counter key.
	tenantShared bool
	// per file
	name   string
	domain string
	budget int
	full   bool // budget or MaxDescriptors exhausted: reported once, stop
	// capped: MaxProblems reached; nothing more is read.
	capped bool
}

func (b *builder) errorf(n *yaml.Node, format string, args ...any) {
	if len(b.problems) > MaxProblems {
		return
	}
	if len(b.problems) == MaxProblems {
		format, args = "config error, more than %d problems: fix these first", []any{MaxProblems}
		b.capped = true
	}
	pr := problem.Problem{File: b.name, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		pr.Line, pr.Column = n.Line, n.Column
	}
	b.problems = append(b.problems, pr)
}

func (b *builder) where(n *yaml.Node) string {
	return fmt.Sprintf("%s:%d:%d", b.name, n.Line, n.Column)
}

// visit resolves an alias and charges the node to the file's budget;
// nil once the budget is spent.
func (b *builder) visit(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n == nil || b.full || b.capped {
		return nil
	}
	b.budget--
	if b.budget < 0 {
		b.full = true
		b.errorf(n, "config error, the YAML expands to more than %d nodes (aliases and merges counted where used): use fewer aliases of large mappings or lists", maxNodes)
		return nil
	}
	return n
}

func (b *builder) file(f File) {
	b.name, b.budget, b.full = f.Name, maxNodes, false
	if len(f.Data) > MaxFileBytes {
		b.errorf(nil, "error loading config file: %d bytes is larger than the %d a file may have", len(f.Data), MaxFileBytes)
		return
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(f.Data, &doc); err != nil {
		b.errorf(nil, "error loading config file: %s", err)
		return
	}
	var top *yaml.Node
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		top = b.visit(doc.Content[0])
	}
	if top == nil || top.Kind == yaml.ScalarNode && top.Tag == "!!null" {
		b.errorf(nil, "config file cannot have empty domain")
		return
	}
	if top.Kind != yaml.MappingNode {
		b.errorf(top, "error loading config file: cannot unmarshal %s into the configuration (a mapping with domain and descriptors)", kindName(top))
		return
	}
	var domain string
	var domainNode, descNode *yaml.Node
	b.mapping(top, "the top level", rootKeys, func(k string, kn, v *yaml.Node) {
		switch k {
		case "domain":
			domain, _ = b.str(v)
			domainNode = kn
		case "descriptors":
			descNode = v
		}
	})
	if domain == "" {
		b.errorf(cmp.Or(domainNode, top), "config file cannot have empty domain")
		return
	}
	b.domain = domain
	lv, merged := b.cfg.byDomain[domain]
	if merged && !b.opts.MergeDomains {
		b.errorf(domainNode, "duplicate domain '%s' in config file", domain)
		return
	}
	if !merged {
		lv = &level{}
		b.cfg.byDomain[domain] = lv
		b.cfg.domains = append(b.cfg.domains, domain)
	}
	if descNode != nil {
		b.level(descNode, lv, domain, nil, 1)
	}
}

// mapping walks a mapping's keys, merges resolved (see pairs), reporting
// non-string, unknown, misplaced and repeated ones.
func (b *builder) mapping(n *yaml.Node, what string, allowed []string, fn func(k string, kn, v *yaml.Node)) {
	// A key is given twice when one mapping has it twice; a merge that
	// brings the same pairs twice (<<: [*a, *a]) repeats no key.
	type written struct {
		in *yaml.Node
		k  string
	}
	seen := map[written]*yaml.Node{}
	b.pairs(n, nil, func(in, kn, v *yaml.Node) {
		if kn.Kind != yaml.ScalarNode || kn.Tag != "!!str" {
			b.errorf(kn, "config error, key is not of type string: %s", nodeText(kn))
			return
		}
		k := kn.Value
		if !slices.Contains(allowed, k) {
			if home := homeOf(k); home != "" {
				b.errorf(kn, "config error, key '%s' does not belong in %s (envoyproxy/ratelimit ignores it there): move it to %s, or remove it", k, what, home)
			} else {
				b.errorf(kn, "config error, unknown key '%s'", k)
			}
			return
		}
		if first, dup := seen[written{in, k}]; dup && first != kn {
			upstream := "uses the last"
			if k == "rate_limit" || k == "metadata" {
				upstream = "combines their fields"
			}
			b.errorf(kn, "config error, key '%s' given twice in %s (first at %s): remove one (envoyproxy/ratelimit %s)", k, what, b.where(first), upstream)
			return
		}
		seen[written{in, k}] = kn
		fn(k, kn, v)
	})
}

// pairs calls fn with each key and value of mapping n in the order
// gopkg.in/yaml.v2, upstream's decoder, applies them, so that the value
// applied last is the one that holds: a merge key (<<) stands, where it
// is written, for the pairs of the mapping it names (an alias or a
// mapping written in place), or of each mapping of a list it names, the
// last first, so that of a list the earlier mapping wins. A key written
// after the merge therefore overrides a merged one, and a merge written
// after a key overrides that key. in is the mapping a pair is written
// in. stack holds the mappings being merged into, to refuse a cycle.
func (b *builder) pairs(n *yaml.Node, stack []*yaml.Node, fn func(in, kn, v *yaml.Node)) {
	if slices.Contains(stack, n) {
		b.errorf(n, "error loading config file: a merge (<<) includes the mapping it is in: merge another mapping")
		return
	}
	if len(stack) > maxMergeDepth {
		b.errorf(n, "config error, merges (<<) nest deeper than %d levels: merge fewer mappings that merge others", maxMergeDepth)
		return
	}
	stack = append(stack, n)
	for i := 0; i+1 < len(n.Content); i += 2 {
		// An alias is never a merge key, as in yaml.v2.
		raw, v := n.Content[i], n.Content[i+1]
		kn := b.visit(raw)
		if kn == nil {
			return
		}
		if raw.Kind != yaml.ScalarNode || raw.Tag != "!!merge" || raw.Value != "<<" {
			fn(n, kn, v)
			continue
		}
		src := b.visit(v)
		if src == nil {
			return
		}
		switch src.Kind {
		case yaml.MappingNode:
			b.pairs(src, stack, fn)
		case yaml.SequenceNode:
			for j := len(src.Content) - 1; j >= 0; j-- {
				m := b.visit(src.Content[j])
				if m == nil {
					return
				}
				if m.Kind != yaml.MappingNode {
					b.errorf(m, "error loading config file: yaml: map merge requires map or sequence of maps as the value, not %s: merge a mapping (<<: *anchor) or a list of them", nodeText(m))
					continue
				}
				b.pairs(m, stack, fn)
			}
		default:
			b.errorf(src, "error loading config file: yaml: map merge requires map or sequence of maps as the value, not %s: merge a mapping (<<: *anchor) or a list of them", nodeText(src))
		}
	}
}

func homeOf(k string) string {
	switch {
	case slices.Contains(rootKeys, k) && k != "descriptors":
		return "the top level"
	case slices.Contains(descriptorKeys, k):
		return "a descriptor"
	case slices.Contains(rateLimitKeys, k):
		return "rate_limit"
	}
	return ""
}

// seq returns the elements of a list of mappings, reporting any other element.
func (b *builder) seq(n *yaml.Node) []*yaml.Node {
	n = b.visit(n)
	if n == nil || n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		b.errorf(n, "error loading config file: cannot unmarshal %s into a list", kindName(n))
		return nil
	}
	var out []*yaml.Node
	for _, e := range n.Content {
		e = b.visit(e)
		if e == nil {
			return out
		}
		if e.Kind != yaml.MappingNode {
			b.errorf(e, "config error, yaml file contains list of type other than map: %s", nodeText(e))
			continue
		}
		out = append(out, e)
	}
	return out
}

func (b *builder) level(n *yaml.Node, lv *level, parentKey string, path []string, depth int) {
	elems := b.seq(n)
	if len(elems) == 0 {
		return
	}
	if depth > MaxDepth {
		b.errorf(elems[0], "config error, descriptors nest deeper than %d levels: Envoy sends one entry per level, so flatten them", MaxDepth)
		return
	}
	for _, e := range elems {
		if b.full || b.capped {
			return
		}
		b.descriptors++
		if b.descriptors > MaxDescriptors {
			b.full = true
			b.errorf(e, "config error, more than %d descriptors in all files", MaxDescriptors)
			return
		}
		b.descriptor(e, lv, parentKey, path, depth)
	}
}

type rateLimitNodes struct {
	unit, rpu, unlimited, name, replaces, algorithm, overridable, charge *yaml.Node
	count, leaseTTL                                                      *yaml.Node
}

// descriptorSpec is one descriptor mapping as read.
type descriptorSpec struct {
	key, value                   string
	keyNode, children, shareNode *yaml.Node
	// rateLimits are every rate_limit given (by merges), in the order
	// applied: upstream decodes each into the same struct.
	rateLimits    []*yaml.Node
	shadow, share bool
}

func (b *builder) descriptor(e *yaml.Node, lv *level, parentKey string, path []string, depth int) {
	d := b.readDescriptor(e)
	at := cmp.Or(d.keyNode, e)
	if d.key == "" {
		b.errorf(at, "descriptor has empty key")
		return
	}
	composite := d.key
	if d.value != "" {
		composite = d.key + "_" + d.value
	}
	finalKey := parentKey + "." + composite
	wild := strings.Contains(d.value, "*")
	b.checkShare(d, composite, wild)
	if !b.claimComposite(lv, composite, finalKey, at) {
		return
	}
	nd := &node{rule: -1, value: d.value, share: d.share && wild}
	if depth == 1 {
		b.tenantShared = nd.share
	}
	addNode(lv, d.key, wild, nd)
	path = append(path[:len(path):len(path)], composite)
	b.addRule(nd, d, at, finalKey, path)
	if d.children != nil {
		nd.children = &level{}
		b.level(d.children, nd.children, finalKey, path, depth+1)
	}
}

// readDescriptor reads the fields of descriptor e.
func (b *builder) readDescriptor(e *yaml.Node) descriptorSpec {
	var d descriptorSpec
	b.mapping(e, "a descriptor", descriptorKeys, func(k string, kn, v *yaml.Node) {
		switch k {
		case "key":
			d.key, _ = b.str(v)
			d.keyNode = kn
		case "value":
			d.value, _ = b.str(v)
		case "rate_limit":
			d.rateLimits = append(d.rateLimits, v)
		case "descriptors":
			d.children = v
		case "shadow_mode":
			d.shadow, _ = b.boolean(v)
		case "share_threshold":
			d.share, _ = b.boolean(v)
			d.shareNode = kn
		case "detailed_metric", "value_to_metric":
			// Accepted and validated; metrics here are labelled by the
			// configuration only (see docs/design/envoyproxy-ratelimit-config.md).
			b.boolean(v)
		case "quota_mode":
			if q, _ := b.boolean(v); q {
				b.errorf(kn, "quota_mode is not supported by ratelimit-authz: remove it, or set it to false (an over-limit quota descriptor would fail the request here)")
			}
		case "metadata":
			b.metadata(v)
		}
	})
	return d
}

// checkShare reports a share_threshold on a descriptor whose value has
// no wildcard.
func (b *builder) checkShare(d descriptorSpec, composite string, wild bool) {
	switch {
	case d.share && !wild && strings.Contains(d.key, "*"):
		// Upstream takes key_value as one pattern, so a '*' in the key
		// passes its check there; a key is literal here (see
		// docs/design/envoyproxy-ratelimit-config.md).
		b.errorf(d.shareNode, "share_threshold can only be used with wildcard values (containing '*'), but found key '%s': a key is matched literally here, so write the '*' in value (key: %s, value: \"*\")", composite, strings.ReplaceAll(d.key, "*", ""))
	case d.share && !wild:
		b.errorf(d.shareNode, "share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", composite)
	}
}

// claimComposite records composite as taken among the descriptors of lv;
// false, with a problem reported, when a sibling has it already.
func (b *builder) claimComposite(lv *level, composite, finalKey string, at *yaml.Node) bool {
	seen := b.composites[lv]
	if seen == nil {
		seen = map[string]bool{}
		b.composites[lv] = seen
	}
	if seen[composite] {
		b.errorf(at, "duplicate descriptor composite key '%s'", finalKey)
		return false
	}
	seen[composite] = true
	return true
}

// addNode places nd, of key and value nd.value, in lv: among the
// wildcards (wild), the exact values, or as the key's descriptor without
// a value.
func addNode(lv *level, key string, wild bool, nd *node) {
	if lv.byKey == nil {
		lv.byKey = map[string]*keyed{}
	}
	kd := lv.byKey[key]
	if kd == nil {
		kd = &keyed{}
		lv.byKey[key] = kd
	}
	switch {
	case wild:
		nd.segments = strings.Split(nd.value, "*")
		kd.wild = append(kd.wild, nd)
	case nd.value != "":
		if kd.exact == nil {
			kd.exact = map[string]*node{}
		}
		kd.exact[nd.value] = nd
	default:
		kd.keyOnly = nd
	}
}

// addRule makes the rule of descriptor d, if it has a valid one, the
// rule of nd. path is the composite keys from the domain down to d.
func (b *builder) addRule(nd *node, d descriptorSpec, at *yaml.Node, finalKey string, path []string) {
	r, ok := b.rateLimit(d.rateLimits)
	if !ok || !b.leaseDescriptor(r, at, d.value, d.children) {
		return
	}
	r.StatsKey = finalKey
	r.Shadow = d.shadow
	r.Domain = b.domain
	r.Bucket = bucketName("rls/", append([]string{r.Domain}, path...)...)
	r.File, r.Line, r.Column = b.name, at.Line, at.Column
	nd.rule = len(b.cfg.rules)
	b.cfg.rules = append(b.cfg.rules, r)
}

// rateLimit reads a descriptor's rate_limit, given once or more (a merge
// and an explicit one) as upstream's decoder reads it: each mapping sets
// its fields over the ones before, a null drops them all. ok false: no
// rule (no rate_limit, or a problem).
func (b *builder) rateLimit(given []*yaml.Node) (Rule, bool) {
	before := len(b.problems)
	var rl *yaml.Node
	r := Rule{Algorithm: b.opts.DefaultAlgorithm}
	var nodes rateLimitNodes
	var unitText string
	for _, n := range given {
		n = b.visit(n)
		if n == nil {
			return Rule{}, false
		}
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			rl, r, nodes, unitText = nil, Rule{Algorithm: b.opts.DefaultAlgorithm}, rateLimitNodes{}, ""
			continue
		}
		if n.Kind != yaml.MappingNode {
			b.errorf(n, "error loading config file: cannot unmarshal %s into rate_limit (a mapping)", kindName(n))
			continue
		}
		rl = n
		b.rateLimitFields(rl, &r, &nodes, &unitText)
	}
	if rl == nil {
		return Rule{}, false
	}
	r, _ = b.checkRateLimit(rl, r, nodes, unitText)
	return r, len(b.problems) == before
}

// rateLimitFields sets the fields one rate_limit mapping gives.
func (b *builder) rateLimitFields(rl *yaml.Node, r *Rule, nodes *rateLimitNodes, unitText *string) {
	b.mapping(rl, "rate_limit", rateLimitKeys, func(k string, kn, v *yaml.Node) {
		switch k {
		case "unit":
			*unitText, _ = b.str(v)
			nodes.unit = kn
		case "requests_per_unit":
			r.RequestsPerUnit, _ = b.uint32(v)
			nodes.rpu = v
		case "unlimited":
			r.Unlimited, _ = b.boolean(v)
		case "name":
			r.Name, _ = b.str(v)
			nodes.name = v
		case "replaces":
			nodes.replaces = v
		case "algorithm":
			nodes.algorithm = v
			a, ok := b.str(v)
			switch {
			case !ok:
			case a == "fixed":
				r.Algorithm = counter.Fixed
			case a == "sliding":
				r.Algorithm = counter.Sliding
			default:
				b.errorf(v, "rate_limit.algorithm must be fixed or sliding, not '%s'", a)
			}
		case "overridable":
			r.Overridable, _ = b.boolean(v)
			nodes.overridable = v
		case "charge":
			r.Charge, _ = b.boolean(v)
			nodes.charge = v
		case "count":
			nodes.count = v
			switch c, _ := b.str(v); c {
			case "requests":
				r.Concurrency = false
			case "concurrency":
				r.Concurrency = true
			default:
				b.errorf(v, "rate_limit.count must be requests or concurrency, not '%s'", c)
			}
		case "lease_ttl":
			nodes.leaseTTL = v
			r.LeaseTTL, _ = b.duration(v)
		}
	})
}

// concurrencyRule checks a rule with count: concurrency: a limit of
// requests in flight, no window, nothing a window or a cost would mean.
func (b *builder) concurrencyRule(rl *yaml.Node, r *Rule, nodes rateLimitNodes, unitText string) {
	switch {
	case r.Unlimited:
		b.errorf(nodes.count, "a concurrency rule cannot be unlimited: it limits requests in flight")
	case unitText != "":
		b.errorf(nodes.unit, "a concurrency rule has no unit: requests_per_unit is the requests in flight at once")
	case r.RequestsPerUnit == 0:
		b.errorf(cmp.Or(nodes.rpu, rl), "a concurrency rule needs requests_per_unit of at least 1: the requests in flight at once")
	case int64(r.RequestsPerUnit) > counter.MaxLimit:
		b.errorf(nodes.rpu, "requests_per_unit %d is above the largest limit ratelimit-authz counts (%d: counter.MaxLimit)", r.RequestsPerUnit, counter.MaxLimit)
	}
	if r.Charge {
		b.errorf(nodes.charge, "a concurrency rule cannot charge: a request holds one lease, whatever its cost")
	}
	if nodes.algorithm != nil {
		b.errorf(nodes.algorithm, "a concurrency rule has no window: remove algorithm")
	}
	if r.Overridable {
		b.errorf(nodes.overridable, "a concurrency rule cannot be overridable in an envoyproxy/ratelimit file: use a count: concurrency bucket of the rules file for per-tenant limits")
	}
	if r.LeaseTTL == 0 {
		r.LeaseTTL = limits.DefaultLeaseTTL
	}
}

// leaseDescriptor checks where a concurrency rule is written: its
// descriptor's entry is the request id, so it takes any value (no value
// of its own) and nothing is below it. Other rules pass.
func (b *builder) leaseDescriptor(r Rule, at *yaml.Node, value string, children *yaml.Node) bool {
	if !r.Concurrency {
		return true
	}
	ok := true
	if value != "" {
		b.errorf(at, "a concurrency rule's descriptor is the request id (e.g. key: request_id from x-request-id): give it no value")
		ok = false
	}
	if children != nil {
		b.errorf(at, "a concurrency rule's descriptor is the request id, the descriptor's last entry: nothing may be below it")
		ok = false
	}
	return ok
}

// duration reads lease_ttl: a Go duration of whole seconds, 1s to
// limits.MaxLeaseTTL.
func (b *builder) duration(n *yaml.Node) (time.Duration, bool) {
	s, ok := b.str(n)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Second || d > limits.MaxLeaseTTL || d%time.Second != 0 {
		b.errorf(n, "rate_limit.lease_ttl must be a duration of whole seconds from 1s to %s (e.g. 60s, 5m), not '%s'", limits.MaxLeaseTTL, s)
		return 0, false
	}
	return d, true
}

// checkRateLimit completes and checks a rule once every rate_limit
// mapping of its descriptor is applied (rl is the last).
func (b *builder) checkRateLimit(rl *yaml.Node, r Rule, nodes rateLimitNodes, unitText string) (Rule, bool) {
	before := len(b.problems)
	// After the mappings: name may follow replaces.
	for _, e := range b.seq(nodes.replaces) {
		var name string
		b.mapping(e, "a replaces entry", replacesKeys, func(_ string, _, v *yaml.Node) { name, _ = b.str(v) })
		switch {
		case name == "":
			b.errorf(e, "should not have an empty replaces entry")
		case name == r.Name:
			b.errorf(e, "replaces should not contain name of same descriptor")
		default:
			r.Replaces = append(r.Replaces, name)
		}
	}
	if nodes.leaseTTL != nil && !r.Concurrency {
		b.errorf(nodes.leaseTTL, "only a concurrency rule (count: concurrency) has leases: remove lease_ttl")
	}
	if r.Concurrency {
		b.concurrencyRule(rl, &r, nodes, unitText)
		return r, len(b.problems) == before
	}
	u, unitOK := parseUnit(unitText)
	if r.Unlimited {
		if unitOK {
			b.errorf(cmp.Or(nodes.unit, rl), "should not specify rate limit unit when unlimited")
		}
	} else if !unitOK {
		b.errorf(cmp.Or(nodes.unit, rl), "invalid rate limit unit '%s'", unitText)
	} else {
		r.Unit = u
		if ms := u.Seconds() * 1000; ms > counter.MaxScaleMS {
			b.errorf(nodes.unit, "unit %s (%d s) is longer than the longest window ratelimit-authz counts (%d ms, about %d days: counter.MaxScaleMS): use month with a twelfth of the limit", u, u.Seconds(), int64(counter.MaxScaleMS), int64(counter.MaxScaleMS)/86_400_000)
		} else if int64(r.RequestsPerUnit) > counter.MaxLimit {
			b.errorf(nodes.rpu, "requests_per_unit %d is above the largest limit ratelimit-authz counts (%d: counter.MaxLimit): lower it, or write unlimited: true (without unit) for no limit", r.RequestsPerUnit, counter.MaxLimit)
		} else if l, ok := r.Limit(); ok {
			if err := l.Validate(); err != nil {
				b.errorf(rl, "%v", err)
			}
		}
	}
	if r.Charge && r.Unlimited {
		b.errorf(nodes.charge, "an unlimited rule cannot charge: it counts nothing")
	}
	if r.Overridable {
		switch first, dup := b.overridable[r.Name]; {
		case r.Unlimited:
			b.errorf(nodes.overridable, "an unlimited rule cannot be overridable: a tenant override sets a limit")
		case b.tenantShared:
			b.errorf(nodes.overridable, "an overridable rule's first descriptor cannot have share_threshold: its value is the tenant, and every tenant it matches would share one count under the limit of whichever tenant a request names")
		case !match.ValidBucketName(r.Name):
			b.errorf(cmp.Or(nodes.name, nodes.overridable), "an overridable rule needs rate_limit.name to be a bucket name ([a-z][a-z0-9_]{0,62}), not '%s': tenant overrides name it", r.Name)
		case dup:
			b.errorf(nodes.name, "rate_limit.name '%s' is overridable in two rules (first at %s): tenant overrides could not tell them apart", r.Name, first)
		default:
			b.overridable[r.Name] = b.where(nodes.name)
		}
	}
	return r, len(b.problems) == before
}

// metadata checks a metadata mapping converts to a protobuf Struct, as
// upstream: scalar keys (upstream's decoder makes a string of 1, true or
// 1.5 there), any values, merges resolved, bounded nesting.
func (b *builder) metadata(n *yaml.Node) {
	n = b.visit(n)
	if n == nil || n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return
	}
	if n.Kind != yaml.MappingNode {
		b.errorf(n, "error parsing metadata: %s is not a mapping", kindName(n))
		return
	}
	var walk func(n *yaml.Node, depth int)
	deep := false // reported once for the whole tree
	value := func(v *yaml.Node, depth int) {
		if v = b.visit(v); v != nil && !deep && (v.Kind == yaml.MappingNode || v.Kind == yaml.SequenceNode) {
			walk(v, depth+1)
		} else if v != nil {
			b.metadataScalar(v)
		}
	}
	walk = func(n *yaml.Node, depth int) {
		if depth > maxMetadataDepth {
			b.errorf(n, "error parsing metadata: nested deeper than %d levels: flatten it", maxMetadataDepth)
			deep = true
			return
		}
		if n.Kind == yaml.SequenceNode {
			for _, c := range n.Content {
				value(c, depth)
			}
			return
		}
		b.pairs(n, nil, func(_, kn, v *yaml.Node) {
			if kn.Kind != yaml.ScalarNode {
				b.errorf(kn, "error parsing metadata: invalid map key: %s: a key is a string, a number or a boolean", nodeText(kn))
				return
			}
			b.metadataScalar(kn)
			value(v, depth)
		})
	}
	walk(n, 1)
}

// metadataScalar refuses a !!binary scalar in metadata that upstream
// cannot make a protobuf string of.
func (b *builder) metadataScalar(n *yaml.Node) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!binary" {
		return
	}
	if v, ok := b.str(n); ok && !utf8.ValidString(v) {
		b.errorf(n, "error parsing metadata: proto: invalid UTF-8 in string: %s: metadata holds text", nodeText(&yaml.Node{Kind: yaml.ScalarNode, Value: v}))
	}
}

// str reads a scalar as upstream's YAML decoder does into a string field:
// any scalar but a float (which upstream's key check refuses), null as "".
func (b *builder) str(n *yaml.Node) (string, bool) {
	n = b.visit(n)
	if n == nil {
		return "", false
	}
	if !b.leaf(n) {
		return "", false
	}
	if n.Tag == "!!null" {
		return "", true
	}
	if n.Kind != yaml.ScalarNode {
		b.errorf(n, "error loading config file: cannot unmarshal %s into string", kindName(n))
		return "", false
	}
	if n.Tag == "!!binary" {
		// Upstream's decoder reads the bytes a !!binary value encodes.
		v, err := base64.StdEncoding.DecodeString(n.Value)
		if err != nil {
			b.errorf(n, "error loading config file: yaml: !!binary value contains invalid base64 data")
			return "", false
		}
		return string(v), true
	}
	return n.Value, true
}

// leaf reports a float as upstream's key check does.
func (b *builder) leaf(n *yaml.Node) bool {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!float" {
		b.errorf(n, "error checking config: %s is a float; values are strings, whole numbers or booleans", n.Value)
		return false
	}
	return true
}

// boolean reads a bool, also in YAML 1.1 spellings (yes, no, on, off)
// that upstream's YAML 1.1 decoder takes as booleans.
func (b *builder) boolean(n *yaml.Node) (bool, bool) {
	n = b.visit(n)
	if n == nil || !b.leaf(n) {
		return false, false
	}
	if n.Kind == yaml.ScalarNode {
		switch n.Tag {
		case "!!null":
			return false, true
		case "!!bool":
			v, err := strconv.ParseBool(strings.ToLower(n.Value))
			if err == nil {
				return v, true
			}
		case "!!str":
			switch n.Value {
			case "y", "Y", "yes", "Yes", "YES", "on", "On", "ON":
				return true, true
			case "n", "N", "no", "No", "NO", "off", "Off", "OFF":
				return false, true
			}
		}
	}
	b.errorf(n, "error loading config file: cannot unmarshal %s into bool", nodeText(n))
	return false, false
}

func (b *builder) uint32(n *yaml.Node) (uint32, bool) {
	n = b.visit(n)
	if n == nil || !b.leaf(n) {
		return 0, false
	}
	if n.Kind == yaml.ScalarNode {
		switch n.Tag {
		case "!!null":
			return 0, true
		case "!!int":
			// As upstream's decoder: a sign (+5, -0) and base prefixes.
			v, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
			if err == nil && v >= 0 && v <= math.MaxUint32 {
				return uint32(v), true
			}
		}
	}
	b.errorf(n, "error loading config file: cannot unmarshal %s into uint32", nodeText(n))
	return 0, false
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "!!map"
	case yaml.SequenceNode:
		return "!!seq"
	}
	return n.Tag
}

// nodeText shows a node in a message: a scalar's tag and value (quoted,
// cut at 64 bytes), a collection's kind.
func nodeText(n *yaml.Node) string {
	if n.Kind != yaml.ScalarNode {
		return kindName(n)
	}
	v := n.Value
	if len(v) > 64 {
		v = v[:64] + "…"
	}
	return strconv.Quote(v)
}

// finish names the limit buckets and checks every bucket name is unique
// (only a digest collision could break that).
func (b *builder) finish() {
	c := b.cfg
	slices.Sort(c.domains)
	seen := make(map[string]bool, len(c.rules)+len(c.domains)*numUnits)
	for i := range c.rules {
		r := &c.rules[i]
		if seen[r.Bucket] {
			b.name = r.File
			b.errorf(&yaml.Node{Line: r.Line, Column: r.Column}, "config error, bucket name %s is used twice", r.Bucket)
		}
		seen[r.Bucket] = true
	}
	for d, domain := range c.domains {
		c.domainIndex[domain] = d
		for u := Second; int(u) <= numUnits; u++ {
			lb := LimitBucket{Domain: domain, Unit: u, Bucket: bucketName("rls-limit/", domain, u.String())}
			if seen[lb.Bucket] {
				b.name = domain
				b.errorf(nil, "config error, bucket name %s is used twice", lb.Bucket)
			}
			seen[lb.Bucket] = true
			c.limitBuckets = append(c.limitBuckets, lb)
		}
	}
}
