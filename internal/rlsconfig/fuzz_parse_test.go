package rlsconfig_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
	"github.com/ratelimit-authz/ratelimit-authz/internal/problem"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
)

// FuzzParse: any bytes parse without a panic, into either problems (each
// naming the file) or a Config whose bucket names are unique, bounded and
// never ext_authz names, and which a second parse reproduces exactly.
func FuzzParse(f *testing.F) {
	for _, n := range []string{"basic_config.yaml", "wildcard.yaml", "share_threshold.yaml"} {
		b, err := os.ReadFile(filepath.Join("testdata", n))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		"", "domain: d", "domain: d\ndescriptors: [a]", "0.25: x",
		"domain: d\ndescriptors: &a [{key: k, descriptors: *a}]",
		"domain: d\ndescriptors:\n  - key: k\n    value: \"*a*\"\n    share_threshold: true\n    rate_limit: {unit: week, requests_per_unit: 0, algorithm: sliding}\n",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, name: n, replaces: [{name: m}]}\n    metadata: {a: [1, {b: 2.5}]}\n",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10000, charge: true, overridable: true, name: t}\n  - key: u\n    rate_limit: {unlimited: true, charge: yes}\n",
		"domain: d\ndescriptors:\n  - key: t\n    descriptors:\n      - key: id\n        rate_limit: {count: concurrency, requests_per_unit: 5, lease_ttl: 30s}\n  - key: u\n    value: v\n    rate_limit: {count: concurrency, unit: second, lease_ttl: 1ms, charge: true}\n",
		"domain: \"\\0/#%\"\ndescriptors: [{key: \"\\u00e9\", rate_limit: {unit: SECOND, requests_per_unit: 0x10}}]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		files := []rlsconfig.File{{Name: "f.yaml", Data: data}}
		c, err := rlsconfig.Parse(files, rlsconfig.Options{})
		if err != nil {
			ps, ok := problem.As(err)
			if !ok || len(ps) == 0 || len(ps) > rlsconfig.MaxProblems+1 || c != nil {
				t.Fatalf("error %v (problems %v), config %v", err, ok, c != nil)
			}
			for _, p := range ps {
				if p.File != "f.yaml" || p.Msg == "" {
					t.Fatalf("problem %+v", p)
				}
			}
			return
		}
		c2, err := rlsconfig.Parse(files, rlsconfig.Options{})
		if err != nil || len(c2.Rules()) != len(c.Rules()) || len(c2.LimitBuckets()) != len(c.LimitBuckets()) {
			t.Fatalf("a second parse differs: %v", err)
		}
		seen := map[string]bool{}
		for i, r := range c.Rules() {
			if r.Bucket != c2.Rules()[i].Bucket || r.StatsKey != c2.Rules()[i].StatsKey {
				t.Fatalf("rule %d named %q then %q", i, r.Bucket, c2.Rules()[i].Bucket)
			}
			if seen[r.Bucket] || len(r.Bucket) > rlsconfig.MaxBucketName || match.ValidBucketName(r.Bucket) {
				t.Fatalf("bucket %q", r.Bucket)
			}
			seen[r.Bucket] = true
			if l, ok := r.Limit(); ok {
				if err := l.Validate(); err != nil {
					t.Fatalf("rule %d: %v", i, err)
				}
			}
		}
		for _, lb := range c.LimitBuckets() {
			if seen[lb.Bucket] || len(lb.Bucket) > rlsconfig.MaxBucketName {
				t.Fatalf("limit bucket %q", lb.Bucket)
			}
			seen[lb.Bucket] = true
		}
		// The same descriptors match the same rules with the same keys.
		probes := [][]*ratelimitv3.RateLimitDescriptor_Entry{decodeEntries(data), entries("k", "v"), entries("k", "")}
		for _, d := range c.Domains() {
			for _, es := range probes {
				r1, k1, _ := c.Match(d, es, nil)
				r2, k2, _ := c2.Match(d, es, nil)
				if r1 != r2 || !bytes.Equal(k1, k2) {
					t.Fatalf("%q %v: rule %d %q, then %d %q", d, es, r1, k1, r2, k2)
				}
			}
		}
	})
}
