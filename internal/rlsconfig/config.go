package rlsconfig

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
)

// Config is a parsed, validated set of envoyproxy/ratelimit
// configuration files. It is immutable and safe for concurrent use; the
// zero Config has no domains.
type Config struct {
	rules        []Rule
	domains      []string // sorted
	byDomain     map[string]*level
	domainIndex  map[string]int
	limitBuckets []LimitBucket // domain index × numUnits + unit−1
}

// level is one list of descriptors (a domain's, or a descriptor's
// children). A request entry reaches a descriptor only under the
// descriptor's own key, so every lookup is by the entry's key first.
type level struct {
	byKey map[string]*keyed
}

// keyed holds a level's descriptors of one key.
type keyed struct {
	exact   map[string]*node // value → descriptor
	wild    []*node          // wildcard descriptors in file order
	keyOnly *node            // the descriptor without a value
}

type node struct {
	rule     int      // index in Config.rules, -1 without rate_limit
	segments []string // wildcard: the value split on '*'
	share    bool     // share_threshold: the counter key takes value, not the request's
	value    string
	children *level // nil without descriptors
}

// Limit is the rule's counter limit; false for Unlimited and for
// RequestsPerUnit 0 (nothing to count against: every hit is over). A
// concurrency rule's window is nominal (limits.ConcurrencyScaleMS).
func (r *Rule) Limit() (counter.Limit, bool) {
	if r.Unlimited || r.RequestsPerUnit == 0 {
		return counter.Limit{}, false
	}
	if r.Concurrency {
		return counter.Limit{Limit: int64(r.RequestsPerUnit), ScaleMS: limits.ConcurrencyScaleMS, Algorithm: counter.Fixed}, true
	}
	return counter.Limit{Limit: int64(r.RequestsPerUnit), ScaleMS: r.Unit.Seconds() * 1000, Algorithm: r.Algorithm}, true
}

// Rules lists every descriptor that carries a rate_limit; a rule's index
// is its id in the rls service and the node.
func (c *Config) Rules() []Rule { return c.rules }

// Domains lists the configured domains, sorted.
func (c *Config) Domains() []string { return c.domains }

// LimitBuckets lists the buckets of descriptor-supplied limits, one per
// configured domain and unit; a LimitBucket's index is its id.
func (c *Config) LimitBuckets() []LimitBucket { return c.limitBuckets }

// LimitBucket finds the bucket of descriptor-supplied limits of domain
// in unit u; false when the domain is not configured or u is invalid.
func (c *Config) LimitBucket(domain string, u Unit) (int, bool) {
	d, ok := c.domainIndex[domain]
	if !ok || !u.valid() {
		return -1, false
	}
	return d*numUnits + int(u) - 1, true
}

// Match finds the rule for one request descriptor, as upstream's
// GetLimit: per entry the exact key and value, else the first wildcard
// value of that key in file order, else the key without a value; the
// descriptor's depth must equal the rule's; a miss below a match is final
// (no backtracking). It appends the rule's counter key to key: the raw
// value when the descriptor has one entry, each value uvarint-length
// prefixed otherwise, with the wildcard value in place of the request's
// at share_threshold levels. All descriptors reaching one rule have its
// keys and its depth, so the key is injective over what it counts
// separately.
//
// A concurrency rule's last entry is the request id, not part of its
// counter key: the key is then that of the entries before it, encoded as
// if the descriptor ended there (RequestID returns the id).
//
// rule is -1 when nothing matches (key is returned unchanged);
// domainFound reports whether the domain is configured. Match never
// allocates beyond growing key. A nil entry matches as an empty key and value.
func (c *Config) Match(domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry, key []byte) (rule int, out []byte, domainFound bool) {
	lv, ok := c.byDomain[domain]
	if !ok {
		return -1, key, false
	}
	start := len(key)
	single := len(entries) == 1
	var firstValue string // the first level's value as keyed
	for i, e := range entries {
		n := lv.find(e.GetKey(), e.GetValue())
		if n == nil {
			break
		}
		v := e.GetValue()
		if n.share {
			v = n.value
		}
		if i == 0 {
			firstValue = v
		}
		before := len(key)
		if single {
			key = append(key, v...)
		} else {
			key = binary.AppendUvarint(key, uint64(len(v)))
			key = append(key, v...)
		}
		if i == len(entries)-1 {
			if n.rule < 0 {
				break
			}
			if c.rules[n.rule].Concurrency {
				// The request id (this entry) is left out: the key is the
				// entries' before it, encoded as if the descriptor ended
				// there (one entry alone is its raw value).
				switch i {
				case 0:
					key = key[:start]
				case 1:
					key = append(key[:start], firstValue...)
				default:
					key = key[:before]
				}
			}
			return n.rule, key, true
		}
		if n.children == nil {
			break
		}
		lv = n.children
	}
	return -1, key[:start], true
}

// RequestID is the request id of a descriptor matched to a concurrency
// rule: its last entry's value.
func RequestID(entries []*ratelimitv3.RateLimitDescriptor_Entry) string {
	if len(entries) == 0 {
		return ""
	}
	return entries[len(entries)-1].GetValue()
}

func (lv *level) find(k, v string) *node {
	kd := lv.byKey[k]
	if kd == nil {
		return nil
	}
	if n := kd.exact[v]; n != nil {
		return n
	}
	for _, n := range kd.wild {
		if wildcardMatch(n.segments, v) {
			return n
		}
	}
	return kd.keyOnly
}

// wildcardMatch is upstream's: each '*' matches any run of bytes, the
// segments appear in order, the first as a prefix and the last as a
// suffix of what the others leave.
func wildcardMatch(segs []string, s string) bool {
	if !strings.HasPrefix(s, segs[0]) {
		return false
	}
	s = s[len(segs[0]):]
	last := len(segs) - 1
	for _, m := range segs[1:last] {
		i := strings.Index(s, m)
		if i < 0 {
			return false
		}
		s = s[i+len(m):]
	}
	return strings.HasSuffix(s, segs[last])
}

// AppendKey appends the counter key of a descriptor-supplied limit, which
// has no rule to fix its keys: every entry's key and value,
// uvarint-length prefixed (injective over entry lists).
func AppendKey(entries []*ratelimitv3.RateLimitDescriptor_Entry, key []byte) []byte {
	for _, e := range entries {
		k, v := e.GetKey(), e.GetValue()
		key = binary.AppendUvarint(key, uint64(len(k)))
		key = append(key, k...)
		key = binary.AppendUvarint(key, uint64(len(v)))
		key = append(key, v...)
	}
	return key
}

// MaxBucketName bounds Rule.Bucket and LimitBucket.Bucket.
const MaxBucketName = 255

// escape keeps [A-Za-z0-9_.*-] and writes every other byte as %XX, so an
// escaped part never holds '/', '#' or a byte a log or label would mangle.
func escape(b *strings.Builder, s string) {
	const hexd = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '*' || c == '-' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexd[c>>4])
		b.WriteByte(hexd[c&15])
	}
}

// bucketName is prefix + escaped parts joined by '/', or prefix + "#" +
// a digest when that is longer than MaxBucketName. Escaped parts hold no
// '/' or '#', so distinct part lists give distinct names.
func bucketName(prefix string, parts ...string) string {
	var b strings.Builder
	b.WriteString(prefix)
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('/')
		}
		escape(&b, p)
	}
	if b.Len() <= MaxBucketName {
		return b.String()
	}
	sum := sha256.Sum256([]byte(b.String()))
	return prefix + "#" + hex.EncodeToString(sum[:16])
}
