package configfile

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
)

// Quota is the rate limit quota service (RLQS) part of a configuration:
// which of Envoy's bucket ids count in which bucket of the file, under
// which key. Limits, windows, algorithms and tenant overrides are the
// bucket's; the quota section only maps.
//
// Envoy's rate_limit_quota filter builds a bucket id (a map of string
// entries) per request from its bucket_id_builder; a bucket id matches an
// entry of Quota.Buckets when its entries are exactly the entry's Match
// entries, with equal values, plus the entry's Key entry, whose value is
// the counter key. Any other entry, missing or extra, is no match: the
// set of entry names is Envoy's configuration, the values are the
// request's.
type Quota struct {
	// Domains are the RLQS domains served (the filter's domain); a stream
	// naming another one is refused.
	Domains []string
	// AssignmentTTL is every assignment's assignment_time_to_live: how
	// long an Envoy that hears nothing more from this server keeps
	// enforcing it before its expired_assignment_behavior applies.
	AssignmentTTL time.Duration
	// AbandonAfter is how long a bucket id may go unreported on a stream
	// before the server abandons it (abandon_action) and forgets it.
	AbandonAfter time.Duration
	// Unmatched is what a bucket id that matches no entry is assigned:
	// Allow (ALLOW_ALL) or Deny (DENY_ALL).
	Unmatched Action
	// MaxStreams bounds the RLQS streams served at once by the node.
	MaxStreams int
	// MaxBucketIDs bounds the bucket ids one stream may report.
	MaxBucketIDs int
	// Buckets are the mapping entries, in file order.
	Buckets []QuotaBucket
}

// QuotaBucket maps the bucket ids of one shape to one bucket.
type QuotaBucket struct {
	// Match are the bucket id entries that must be present with exactly
	// these values; may be empty.
	Match map[string]string
	// Bucket counts the usage.
	Bucket int // index into Rules.Buckets
	// Key is the name of the bucket id entry whose value is the counter
	// key; it is not one of Match. An empty value is a missing key: the
	// bucket's on_missing_key decides.
	Key string
	// Cost is what one request Envoy reports counts in the bucket, in its
	// unit: 1 when not given, at most counter.MaxLimit. Envoy's quota
	// filter reports request counts only, so a cost here is a constant per
	// request of the bucket ids the entry matches.
	Cost int64
	// Line is where the entry is in the file.
	Line int
}

// Defaults and bounds of the quota section.
const (
	DefaultQuotaAssignmentTTL = 5 * time.Second
	DefaultQuotaAbandonAfter  = time.Minute
	DefaultQuotaMaxStreams    = 256
	DefaultQuotaMaxBucketIDs  = 1024
	// MaxQuotaEntryBytes bounds a bucket id entry name and a match value
	// in the file.
	MaxQuotaEntryBytes = 256
)

// ValidQuotaEntryName reports whether s may name a bucket id entry: 1 to
// 63 letters, digits and _ . - (safe unquoted in a log and a YAML key).
func ValidQuotaEntryName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// validQuotaDomain: what the filter's domain may be here.
func validQuotaDomain(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// parseQuota reads the quota section; r.Buckets must be parsed already.
func (p *parser) parseQuota(n *yaml.Node, r *Rules) {
	q := &Quota{
		AssignmentTTL: DefaultQuotaAssignmentTTL, AbandonAfter: DefaultQuotaAbandonAfter,
		MaxStreams: DefaultQuotaMaxStreams, MaxBucketIDs: DefaultQuotaMaxBucketIDs,
	}
	var bucketsNode, domainsNode *yaml.Node
	p.eachKey(n, "quota", []string{"domains", "assignment_ttl", "abandon_after", "unmatched", "max_streams", "max_bucket_ids", "buckets"}, func(key string, _, v *yaml.Node) {
		switch key {
		case "domains":
			domainsNode = v
			p.quotaDomains(v, q)
		case "assignment_ttl", "abandon_after":
			p.quotaDuration(key, v, q)
		case "unmatched":
			if i, ok := p.enum(v, "quota.unmatched", "allow", "deny"); ok {
				q.Unmatched = Action(i)
			}
		case "max_streams":
			if x, ok := p.integer(v, "quota.max_streams", 1, 1<<20); ok {
				q.MaxStreams = int(x)
			}
		case "max_bucket_ids":
			if x, ok := p.integer(v, "quota.max_bucket_ids", 1, 1<<20); ok {
				q.MaxBucketIDs = int(x)
			}
		case "buckets":
			bucketsNode = v
		}
	})
	if n.Kind != yaml.MappingNode {
		return
	}
	if domainsNode == nil {
		p.errorf(n, "quota: no domains: name the rate_limit_quota filter's domain(s) served")
	}
	if bucketsNode == nil {
		p.errorf(n, "quota: no buckets: map at least one Envoy bucket id to a bucket")
	} else {
		p.parseQuotaBuckets(bucketsNode, q, r)
	}
	r.Quota = q
}

// quotaDomains reads quota.domains into q.Domains, each once.
func (p *parser) quotaDomains(v *yaml.Node, q *Quota) {
	if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
		p.errorf(v, "quota.domains must be a non-empty list of domain names")
		return
	}
	for _, dn := range v.Content {
		d, ok := p.str(dn, "quota.domains")
		switch {
		case !ok:
		case !validQuotaDomain(d):
			p.errorf(dn, "quota.domains: %q must be 1 to 128 printable characters without spaces", d)
		case slices.Contains(q.Domains, d):
			p.errorf(dn, "quota.domains: %q given twice", d)
		default:
			q.Domains = append(q.Domains, d)
		}
	}
}

// quotaDuration reads quota.assignment_ttl or quota.abandon_after (key)
// into q.
func (p *parser) quotaDuration(key string, v *yaml.Node, q *Quota) {
	d, ok := p.duration(v, "quota."+key, time.Second, 24*time.Hour)
	if !ok {
		return
	}
	if key == "assignment_ttl" {
		if d%time.Second != 0 {
			// Envoy 1.40 reads the TTL in whole seconds, truncated.
			p.errorf(v, "quota.assignment_ttl %v must be whole seconds: Envoy counts the TTL in whole seconds", d)
			return
		}
		q.AssignmentTTL = d
	} else {
		q.AbandonAfter = d
	}
}

// duration parses a Go duration between min and max.
func (p *parser) duration(n *yaml.Node, what string, min, max time.Duration) (time.Duration, bool) {
	s, ok := p.str(n, what)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < min || d > max {
		p.errorf(n, "%s must be a duration between %v and %v (like 5s or 1m), not %q", what, min, max, s)
		return 0, false
	}
	return d, true
}

func (p *parser) parseQuotaBuckets(n *yaml.Node, q *Quota, r *Rules) {
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		p.errorf(n, "quota.buckets must be a non-empty list of { match, bucket, key }")
		return
	}
	seen := map[string]int{} // shape → line of the first entry with it
	for i, en := range n.Content {
		what := fmt.Sprintf("quota.buckets[%d]", i)
		e, ok := p.parseQuotaBucket(en, what, r)
		if !ok {
			continue
		}
		shape := quotaShape(e.Match, e.Key)
		if prev, dup := seen[shape]; dup {
			p.errorf(en, "%s: matches the same bucket ids as the entry at line %d (same match entries and values, same key entry)", what, prev)
			continue
		}
		seen[shape] = e.Line
		q.Buckets = append(q.Buckets, e)
	}
}

// parseQuotaBucket reads the entry en of quota.buckets. ok is false when
// the entry is incomplete or any of it has a problem: it is not used.
func (p *parser) parseQuotaBucket(en *yaml.Node, what string, r *Rules) (QuotaBucket, bool) {
	e := QuotaBucket{Match: map[string]string{}, Cost: 1, Line: en.Line}
	var sawBucket, sawKey bool
	before := len(p.problems)
	p.eachKey(en, what, []string{"match", "bucket", "key", "cost"}, func(key string, _, v *yaml.Node) {
		switch key {
		case "match":
			p.quotaMatch(v, what, e.Match)
		case "bucket":
			sawBucket = true
			p.quotaBucketRef(v, what, r, &e)
		case "key":
			sawKey = true
			name, ok := p.str(v, what+".key")
			if ok && !ValidQuotaEntryName(name) {
				p.errorf(v, "%s.key: entry name %q must be 1 to 63 letters, digits, _ . or -", what, name)
				return
			}
			e.Key = name
		case "cost":
			if x, ok := p.integer(v, what+".cost", 1, counter.MaxLimit); ok {
				e.Cost = x
			}
		}
	})
	if en.Kind != yaml.MappingNode {
		return e, false
	}
	ok := true
	if !sawBucket {
		p.errorf(en, "%s: no bucket", what)
		ok = false
	}
	if !sawKey {
		p.errorf(en, "%s: no key: name the bucket id entry whose value is the counter key", what)
		ok = false
	}
	if _, clash := e.Match[e.Key]; clash {
		p.errorf(en, "%s: entry %q is both matched and the key", what, e.Key)
		ok = false
	}
	return e, ok && len(p.problems) == before
}

// quotaMatch reads an entry's match mapping v into m: entry name → value.
func (p *parser) quotaMatch(v *yaml.Node, what string, m map[string]string) {
	p.eachKey(v, what+".match", nil, func(name string, kn, vn *yaml.Node) {
		if !ValidQuotaEntryName(name) {
			p.errorf(kn, "%s.match: entry name %q must be 1 to 63 letters, digits, _ . or -", what, name)
			return
		}
		val, ok := p.str(vn, what+".match."+name)
		switch {
		case !ok:
		case val == "" || len(val) > MaxQuotaEntryBytes:
			p.errorf(vn, "%s.match.%s: the value must be 1 to %d bytes", what, name, MaxQuotaEntryBytes)
		default:
			m[name] = val
		}
	})
}

// quotaBucketRef reads an entry's bucket v into e.Bucket, reporting a
// bucket that cannot serve quota usage.
func (p *parser) quotaBucketRef(v *yaml.Node, what string, r *Rules, e *QuotaBucket) {
	name, ok := p.str(v, what+".bucket")
	if !ok {
		return
	}
	b := r.BucketIndex(name)
	if b < 0 {
		p.errorf(v, "%s.bucket: unknown bucket %q (known: %s)", what, name, bucketNames(r))
		return
	}
	e.Bucket = b
	if msg := quotaBucketProblem(r, b); msg != "" {
		p.errorf(v, "%s.bucket: bucket %q %s", what, name, msg)
	}
}

// quotaBucketProblem says why bucket b cannot serve quota usage, or "".
func quotaBucketProblem(r *Rules, b int) string {
	bk := r.Buckets[b]
	switch {
	case bk.Count == CountFailures:
		return "counts failures: Envoy's quota reports count requests"
	case bk.Count == CountConcurrency:
		return "counts requests in flight: Envoy's quota reports count requests"
	case bk.Cost.AfterResponse():
		return "charges its cost from the response (" + bk.Cost.String() + "): Envoy's quota reports count requests, never a response's cost"
	case bk.Key.Kind == match.KeyIP:
		return "is keyed by ip: a bucket id carries values as Envoy built them from the request, not the trusted client address an ip key means"
	case bk.Key.Kind == match.KeyAccount:
		return "is keyed by account: a bucket id carries values as Envoy built them from the request, not the normalised login account"
	}
	if _, ok := bk.Configured(); !ok {
		return "has no limit: give it limit and per"
	}
	return ""
}

// quotaShape is a canonical text of the bucket ids an entry matches.
func quotaShape(match map[string]string, key string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(match)) {
		fmt.Fprintf(&b, "%q=%q,", k, match[k])
	}
	fmt.Fprintf(&b, "key=%q", key)
	return b.String()
}
