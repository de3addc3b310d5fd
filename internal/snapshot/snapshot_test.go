package snapshot_test

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

func parse(t *testing.T, yaml string) *configfile.Rules {
	t.Helper()
	r, err := configfile.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func compile(t *testing.T, r *configfile.Rules) *snapshot.Snapshot {
	t.Helper()
	s, err := snapshot.Compile(snapshot.Sources{Rules: r})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const base = `keys: {tenant_header: x-tenant-id}
counter: {reserved_keys: 10}
buckets:
  x: {limit: 10, per: 1s, key: tenant}
  y: {limit: 10, per: 1m, key: tenant, algorithm: sliding}
  z: {limit: 5, per: 1m, key: ip, count: failures}
routes:
  - {method: POST, path: /a, buckets: [x, y, z]}
`

func ids(s *snapshot.Snapshot) map[string]counter.Bucket {
	m := map[string]counter.Bucket{}
	for _, b := range s.Buckets {
		m[b.Name] = b.ID
	}
	return m
}

// A bucket keeps its id while its name, window, algorithm and reserve
// hold, whatever else changes (its limit, its order, the other buckets);
// any of the four changing gives another id, and Dropped lists the ids
// that went away.
func TestIDsFollowWhatMakesCountsComparable(t *testing.T) {
	first := compile(t, parse(t, base))
	if !first.Buckets[2].Reserved {
		t.Fatal("the failures bucket is not reserved")
	}
	// Reordered, x's limit changed, y's window changed, z no longer
	// reserved (it counts requests now), w added.
	second := compile(t, parse(t, `keys: {tenant_header: x-tenant-id}
counter: {reserved_keys: 10}
buckets:
  w: {limit: 1, per: 1s, key: tenant}
  z: {limit: 5, per: 1m, key: ip}
  x: {limit: 99, per: 1s, key: tenant}
  y: {limit: 10, per: 1s, key: tenant, algorithm: sliding}
routes:
  - {method: POST, path: /a, buckets: [w, x, y, z]}
`))
	a, b := ids(first), ids(second)
	if a["x"] != b["x"] {
		t.Error("x changed only its limit and lost its id")
	}
	if a["y"] == b["y"] || a["z"] == b["z"] {
		t.Error("y (window) or z (reserve) kept its id")
	}
	dropped := second.Dropped(first)
	slices.Sort(dropped)
	want := []counter.Bucket{a["y"], a["z"]}
	slices.Sort(want)
	if !slices.Equal(dropped, want) {
		t.Errorf("dropped %v, want y's and z's old ids %v", dropped, want)
	}
	if !second.Has(b["w"]) || second.Has(a["y"]) {
		t.Error("Has disagrees with the buckets")
	}
	// The same sources compile to the same ids.
	if again := ids(compile(t, parse(t, base))); again["y"] != a["y"] {
		t.Error("one configuration compiled twice has two ids")
	}
}

// Two distinct keys with one id would share counts: refused at compile,
// naming both buckets.
func TestCollisionRefused(t *testing.T) {
	r := parse(t, base)
	_, err := snapshot.CompileWith(snapshot.Sources{Rules: r}, func(k snapshot.Key) counter.Bucket {
		if k.Name == "y" {
			return snapshot.ID(snapshot.Key{Name: "x", ScaleMS: 1000})
		}
		return snapshot.ID(k)
	})
	if err == nil || !strings.Contains(err.Error(), `"x"`) || !strings.Contains(err.Error(), `"y"`) {
		t.Fatalf("a collision: %v, want it refused naming x and y", err)
	}
}

// A quota section gives every bucket it maps one participants count,
// named after it, in a window of its own.
func TestQuotaParticipants(t *testing.T) {
	s := compile(t, parse(t, `keys: {tenant_header: x-tenant-id}
buckets:
  x: {limit: 10, per: 1s, key: tenant}
  y: {limit: 10, per: 1s, key: tenant}
routes:
  - {method: POST, path: /a, buckets: [x, y]}
quota:
  domains: [d]
  buckets:
    - {match: {name: a}, key: tenant, bucket: y}
    - {match: {name: b}, key: tenant, bucket: y}
`))
	if len(s.Buckets) != 3 || s.Buckets[0].Participants != nil || s.Buckets[1].Participants != &s.Buckets[2] {
		t.Fatalf("buckets %+v: want y alone to have a participants count", s.Buckets)
	}
	p := s.Buckets[2]
	if p.Name != snapshot.ParticipantsPrefix+"y" || p.Kind != snapshot.Participants || p.Limit.ScaleMS != snapshot.ParticipantsWindow.Milliseconds() {
		t.Errorf("participants count %+v", p)
	}
}

// An id that one snapshot gives to a bucket and the next to another (a
// collision no single compile sees) is dropped: the new bucket does not
// inherit the old one's counts.
func TestCollisionAcrossSnapshotsDropped(t *testing.T) {
	src := func(name string) snapshot.Sources {
		return snapshot.Sources{Rules: parse(t, strings.NewReplacer("x:", name+":", "[x,", "["+name+",").Replace(base))}
	}
	old, err := snapshot.CompileWith(src("x"), snapshot.ByPosition())
	if err != nil {
		t.Fatal(err)
	}
	next, err := snapshot.CompileWith(src("v"), snapshot.ByPosition())
	if err != nil {
		t.Fatal(err)
	}
	if d := next.Dropped(old); !slices.Equal(d, []counter.Bucket{0}) {
		t.Fatalf("dropped %v, want x's id 0, now v's", d)
	}
}

// A bucket's unit is part of what makes its counts comparable: a bucket
// that counted requests and now counts tokens (or counts another header)
// starts afresh, while a cost's max or missing changing keeps its counts.
func TestIDsFollowTheCostUnit(t *testing.T) {
	with := func(cost string) counter.Bucket {
		s := compile(t, parse(t, `buckets:
  x: {limit: 10000, per: 1m, key: tenant`+cost+`}
routes: [{path: /a, buckets: [x]}]
`))
		return s.Buckets[0].ID
	}
	requests := with("")
	tokens := with(", cost: {response_header: x-tokens, max: 100}")
	if tokens == requests {
		t.Error("a bucket that now counts tokens kept the id of its request counts")
	}
	if other := with(", cost: {response_header: x-other}"); other == tokens {
		t.Error("a bucket counting another header kept its id")
	}
	if bytes := with(", cost: content_length"); bytes == requests || bytes == tokens {
		t.Error("a bucket counting bytes kept another unit's id")
	}
	if again := with(", cost: {response_header: x-tokens, max: 5000, missing: 7}"); again != tokens {
		t.Error("changing a cost's max or missing dropped its counts")
	}
	s := compile(t, parse(t, base))
	if got := s.Buckets[2].Cost.Source; got != configfile.CostFailures {
		t.Errorf("the failures bucket's cost is %v", got)
	}
}

// An RLS concurrency rule is a concurrency bucket like the rules file's:
// named to the peers by Concurrency, its id apart from a rate rule's of
// the same name, no peer count merged.
func TestRLSConcurrencyRule(t *testing.T) {
	rules := parse(t, `buckets:
  x: {limit: 5, key: tenant, count: concurrency}
  y: {limit: 10, per: 1s, key: tenant}
routes: [{path: /a, buckets: [x, y]}]
`)
	rc, err := rlsconfig.Parse([]rlsconfig.File{{Name: "f.yaml", Data: []byte(`domain: d
descriptors:
  - key: tenant
    descriptors:
      - key: request_id
        rate_limit: {count: concurrency, requests_per_unit: 3, lease_ttl: 20s}
  - key: other
    rate_limit: {unit: second, requests_per_unit: 3}
`)}}, rlsconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := snapshot.Compile(snapshot.Sources{Rules: rules, RLS: rc})
	if err != nil {
		t.Fatal(err)
	}
	b := s.RLSRules[0]
	if b.Kind != snapshot.InFlight || b.LeaseTTL != 20*time.Second || !b.HasLimit || b.Limit.Limit != 3 || len(b.PeerBounds) != 0 {
		t.Errorf("the concurrency rule's bucket: %+v", b)
	}
	if s.RLSRules[1].Kind != snapshot.Requests {
		t.Error("a rate rule is a concurrency bucket")
	}
	want := map[string]counter.Bucket{"x": s.Buckets[0].ID, b.Name: b.ID}
	if got := s.Concurrency(); !maps.Equal(got, want) {
		t.Errorf("Concurrency %v, want %v", got, want)
	}
	if k := b.CountKey(); k.Unit != "concurrent-requests" {
		t.Errorf("count key %+v", k)
	}
}

// Every bucket has one Kind, set at compile time from its source: the
// rules file's count and cost, an RLS rule's count and charge, the quota
// section's participants counts.
func TestEveryBucketHasOneKind(t *testing.T) {
	rules := parse(t, `keys: {tenant_header: x-tenant-id}
buckets:
  req: {limit: 10, per: 1s, key: tenant}
  hdr: {limit: 10, per: 1s, key: tenant, cost: {request_header: x-n, max: 5}}
  len: {limit: 10, per: 1s, key: tenant, cost: content_length}
  fail: {limit: 10, per: 1m, key: ip, count: failures}
  resp: {limit: 10, per: 1s, key: tenant, cost: {response_header: x-used, max: 5}}
  trl: {limit: 10, per: 1s, key: tenant, cost: {response_trailer: x-used, max: 5}}
  body: {limit: 10, per: 1s, key: tenant, cost: response_bytes}
  conc: {limit: 3, key: tenant, count: concurrency}
routes: [{path: /a, buckets: [req, hdr, len, fail, resp, trl, body, conc]}]
quota:
  domains: [d]
  buckets: [{match: {name: a}, key: tenant, bucket: req}]
`)
	rc, err := rlsconfig.Parse([]rlsconfig.File{{Name: "f.yaml", Data: []byte(`domain: d
descriptors:
  - key: hits
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: charged
    rate_limit: {unit: minute, requests_per_unit: 100, charge: true}
`)}}, rlsconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := snapshot.Compile(snapshot.Sources{Rules: rules, RLS: rc})
	if err != nil {
		t.Fatal(err)
	}
	want := []snapshot.Kind{snapshot.Requests, snapshot.RequestCost, snapshot.RequestCost, snapshot.Failures,
		snapshot.ResponseCost, snapshot.ResponseCost, snapshot.ResponseCost, snapshot.InFlight}
	for i, k := range want {
		if b := s.Buckets[i]; b.Kind != k {
			t.Errorf("bucket %s: %v, want %v", b.Name, b.Kind, k)
		}
		if after := k == snapshot.Failures || k == snapshot.ResponseCost; s.Buckets[i].Kind.AfterResponse() != after {
			t.Errorf("bucket %s: AfterResponse %v", s.Buckets[i].Name, !after)
		}
	}
	if k0, k1 := s.RLSRules[0].Kind, s.RLSRules[1].Kind; k0 != snapshot.Requests || k1 != snapshot.ResponseCost {
		t.Errorf("RLS rules: %v and %v, want requests and response cost", k0, k1)
	}
	if p := s.Buckets[0].Participants; p == nil || p.Kind != snapshot.Participants || p != &s.Buckets[len(s.Buckets)-1] {
		t.Errorf("participants count of req: %+v", p)
	}
	if len(s.RLSLimits) != len(rc.LimitBuckets()) || len(s.RLSRules) != len(rc.Rules()) {
		t.Errorf("%d RLS rule buckets and %d limit buckets, want %d and %d", len(s.RLSRules), len(s.RLSLimits), len(rc.Rules()), len(rc.LimitBuckets()))
	}
}

// A reload compiles the routes once: the snapshot serves the matcher that
// parsing the rules file compiled while it checked it.
func TestMatcherCompiledOnce(t *testing.T) {
	r := parse(t, base)
	m, err := r.Matcher()
	if err != nil {
		t.Fatal(err)
	}
	if s := compile(t, r); s.Matcher != m {
		t.Error("the snapshot compiled the routes again")
	}
}
