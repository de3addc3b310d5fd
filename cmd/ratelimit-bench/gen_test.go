package main

import (
	"math"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/config"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
)

func TestParseMix(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    string // mix.String(), or the error's text
		wantErr bool
	}{
		{in: "api", want: "activities=30,converger_activities=10,converger_uploads=5,inbound=30,inbound_status=10,channel_token=2,channel_token_refresh=1,legacy_tokens=5,admin_login=4,portal_login=3"},
		{in: "activities=3,inbound", want: "activities=3,inbound=1"},
		{in: " legacy_tokens ", want: "legacy_tokens=1"},
		{in: "unmatched", want: "unmatched=1"},
		{in: "", want: "empty route mix", wantErr: true},
		{in: "nope", want: `unknown route "nope"`, wantErr: true},
		{in: "activities=0", want: "not a whole number from 1", wantErr: true},
		{in: "activities=x", want: "not a whole number from 1", wantErr: true},
		{in: "activities,activities=2", want: "named twice", wantErr: true},
	} {
		m, err := parseMix(tc.in)
		if tc.wantErr {
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("parseMix(%q) error = %v, want one containing %q", tc.in, err, tc.want)
			}
			continue
		}
		if err != nil {
			t.Errorf("parseMix(%q): %v", tc.in, err)
			continue
		}
		if got := m.String(); got != tc.want {
			t.Errorf("parseMix(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestMixPickFollowsWeights(t *testing.T) {
	m, err := parseMix("api")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 200_000
	counts := map[string]int{}
	for range n {
		counts[m.pick(rng).name]++
	}
	for _, r := range catalogue {
		got := float64(counts[r.name]) / n * 100
		if math.Abs(got-float64(r.weight)) > 0.6 {
			t.Errorf("%s: %.2f%% of picks, weight %d%%", r.name, got, r.weight)
		}
	}
}

func TestZipfKeys(t *testing.T) {
	k := keySpec{dist: keysZipf, zipfS: 1.1}
	p := k.picker(rand.New(rand.NewPCG(3, 4)), 1000)
	const draws = 400_000
	counts := make([]int, 1000)
	for range draws {
		v := p()
		if v >= 1000 {
			t.Fatalf("key %d out of [0, 1000)", v)
		}
		counts[v]++
	}
	// Weight of rank k is 1/(k+1)^s: rank 0 is 2^1.1 ≈ 2.14 times rank 1
	// and 10^1.1 ≈ 12.6 times rank 9.
	for _, tc := range []struct {
		a, b int
		want float64
	}{{0, 1, math.Pow(2, 1.1)}, {0, 9, math.Pow(10, 1.1)}, {1, 3, math.Pow(2, 1.1)}} {
		got := float64(counts[tc.a]) / float64(counts[tc.b])
		if math.Abs(got-tc.want)/tc.want > 0.1 {
			t.Errorf("count[%d]/count[%d] = %.2f, want ≈ %.2f", tc.a, tc.b, got, tc.want)
		}
	}
	top10 := 0
	for _, c := range counts[:10] {
		top10 += c
	}
	if share := float64(top10) / draws; share < 0.3 {
		t.Errorf("top 10 of 1000 keys got %.0f%% of draws; zipf(1.1) should be skewed (> 30%%)", share*100)
	}
}

func TestUniformKeys(t *testing.T) {
	p := keySpec{dist: keysUniform}.picker(rand.New(rand.NewPCG(5, 6)), 10)
	const draws = 100_000
	counts := make([]int, 10)
	for range draws {
		counts[p()]++
	}
	for k, c := range counts {
		if share := float64(c) / draws; math.Abs(share-0.1) > 0.01 {
			t.Errorf("key %d: %.3f of draws, want 0.1", k, share)
		}
	}
}

func TestUniqueKeysAcrossWorkers(t *testing.T) {
	m, _ := parseMix("legacy_tokens,activities,inbound")
	k := keySpec{dist: keysUnique, tenants: 1, channels: 1, ips: 1, accounts: 1}
	var seq atomic.Uint64
	seen := map[string]bool{}
	for w := range 4 {
		g := newGenerator(m, k, 1, w, &seq)
		for range 2500 {
			r := g.next()
			key := r.route + " " + r.clientIP + " " + r.path + " " + r.headers["x-tenant-id"]
			if seen[key] {
				t.Fatalf("request repeated: %s", key)
			}
			seen[key] = true
		}
	}
	if got := seq.Load(); got != 10_000 {
		t.Errorf("sequence at %d after 10000 requests", got)
	}
}

func TestKeySpecValidate(t *testing.T) {
	ok := keySpec{dist: keysZipf, zipfS: 1.1, tenants: 1, channels: 1, ips: 1, accounts: 1}
	if err := ok.validate(); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*keySpec)
		want string
	}{
		{"dist", func(k *keySpec) { k.dist = "pareto" }, "use uniform, zipf or unique"},
		{"zipf s", func(k *keySpec) { k.zipfS = 1 }, "above 1"},
		{"tenants", func(k *keySpec) { k.tenants = 0 }, "--tenants 0"},
		{"ips", func(k *keySpec) { k.ips = 1<<24 + 1 }, "10.0.0.0/8"},
		{"prefix", func(k *keySpec) { k.prefix = strings.Repeat("x", 65) }, "--key-prefix"},
	} {
		k := ok
		tc.mod(&k)
		if err := k.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

func TestIPKey(t *testing.T) {
	for n, want := range map[uint64]string{0: "10.0.0.0", 1: "10.0.0.1", 256: "10.0.1.0", 65536 + 2: "10.1.0.2", 1<<24 - 1: "10.255.255.255", 1 << 24: "10.0.0.0"} {
		if got := ipKey(n); got != want {
			t.Errorf("ipKey(%d) = %s, want %s", n, got, want)
		}
	}
}

func TestGeneratorIsDeterministic(t *testing.T) {
	m, _ := parseMix("api")
	k := keySpec{dist: keysZipf, zipfS: 1.2, tenants: 50, channels: 50, ips: 50, accounts: 50, prefix: "p-"}
	a := newGenerator(m, k, 7, 3, new(atomic.Uint64))
	b := newGenerator(m, k, 7, 3, new(atomic.Uint64))
	for range 1000 {
		ra, rb := a.next(), b.next()
		if ra.path != rb.path || ra.clientIP != rb.clientIP || ra.body != rb.body || ra.headers["x-tenant-id"] != rb.headers["x-tenant-id"] {
			t.Fatalf("same seed, different requests: %+v vs %+v", ra, rb)
		}
	}
}

// TestCatalogueMatchesShippedConfig keeps the load tool's example API in
// step with config/ratelimit.yaml: every weighted route matches a route
// rule and yields a key for each of its buckets, every route rule is
// exercised by the "api" mix, and "unmatched" matches nothing.
func TestCatalogueMatchesShippedConfig(t *testing.T) {
	r, err := configfile.Parse(config.Default(), config.Name)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := match.New(r.Descriptors())
	if err != nil {
		t.Fatal(err)
	}
	m, _ := parseMix("api")
	k := keySpec{dist: keysUniform, tenants: 3, channels: 3, ips: 3, accounts: 3}
	g := newGenerator(m, k, 1, 0, new(atomic.Uint64))
	exercised := map[int]bool{}
	for _, rt := range catalogue {
		g.mix = mix{routes: []route{rt}, weights: []int{1}, total: 1}
		req := g.next()
		cr := checkRequest(req, 1, time.Unix(0, 0))
		h := cr.GetAttributes().GetRequest().GetHttp()
		in := checkreq.Request{
			Method: h.GetMethod(), Path: h.GetPath(), Headers: checkreq.AppendMap(nil, h.GetHeaders(), nil), Body: h.GetBody(),
			PeerAddress: cr.GetAttributes().GetSource().GetAddress().GetSocketAddress().GetAddress(),
		}
		res := eng.Describe(&in, nil)
		if rt.name == "unmatched" {
			if res.Route >= 0 || len(res.Descriptors) > 0 {
				t.Errorf("unmatched %s matched route %d", req.path, res.Route)
			}
			continue
		}
		if res.Route < 0 || len(res.Descriptors) == 0 {
			t.Errorf("%s (%s %s) matches no route rule of the shipped config", rt.name, req.method, req.path)
			continue
		}
		exercised[res.Route] = true
		for _, d := range res.Descriptors {
			if d.Key == "" {
				t.Errorf("%s: bucket %s has no key", rt.name, r.Buckets[d.Bucket].Name)
			}
		}
		if res.ClientIP != req.clientIP {
			t.Errorf("%s: server sees client %q, generator sent %q", rt.name, res.ClientIP, req.clientIP)
		}
	}
	for i, rr := range r.Routes {
		if !exercised[i] {
			t.Errorf("route rule %d (%s %s) is not exercised by the api mix", i, rr.Method, rr.Path)
		}
	}
}
