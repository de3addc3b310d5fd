package main

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
)

// route is one endpoint of the example API that config/ratelimit.yaml and
// envoy/ratelimit-authz.yaml describe. Names are the Envoy route names.
type route struct {
	name     string
	path     string // template; {channel} is replaced by a channel key
	tenant   bool   // a trusted layer in front sets x-tenant-id (authenticated API)
	login    bool   // a JSON login form in the body (Envoy buffers login bodies)
	weight   int    // share in the "api" mix
	describe string
}

// catalogue is the example API. The weights of the "api" mix are a plausible
// production shape: mostly activity writes and inbound webhooks, a few
// uploads, token calls and logins. TestCatalogueMatchesShippedConfig keeps
// it in step with config/ratelimit.yaml.
var catalogue = []route{
	{name: "activities", path: "/api/activities", tenant: true, weight: 30, describe: "activity_create per tenant"},
	{name: "converger_activities", path: "/api/converger/activities", tenant: true, weight: 10, describe: "activity_create per tenant"},
	{name: "converger_uploads", path: "/api/converger/uploads", tenant: true, weight: 5, describe: "upload per tenant"},
	{name: "inbound", path: "/api/inbound/{channel}", weight: 30, describe: "inbound per channel"},
	{name: "inbound_status", path: "/api/inbound/{channel}/status", weight: 10, describe: "inbound per channel"},
	{name: "channel_token", path: "/api/converger/channels/{channel}/token", tenant: true, weight: 2, describe: "token_generate per channel"},
	{name: "channel_token_refresh", path: "/api/converger/channels/{channel}/token/refresh", tenant: true, weight: 1, describe: "token_generate per channel"},
	{name: "legacy_tokens", path: "/api/v1/tokens", weight: 5, describe: "token_create per client IP"},
	{name: "admin_login", path: "/admin/login", login: true, weight: 4, describe: "login_ip, login_account (peek)"},
	{name: "portal_login", path: "/portal/login", login: true, weight: 3, describe: "login_ip, login_account (peek)"},
	// Not part of the API: no route rule matches, so the check only looks
	// the path up. Not in the "api" mix.
	{name: "unmatched", path: "/static/app.js", describe: "no route rule: allowed, not counted"},
}

func findRoute(name string) (route, bool) {
	i := slices.IndexFunc(catalogue, func(r route) bool { return r.name == name })
	if i < 0 {
		return route{}, false
	}
	return catalogue[i], true
}

// mix is a weighted choice of routes.
type mix struct {
	routes  []route
	weights []int
	total   int
}

func (m *mix) add(r route, w int) {
	m.routes, m.weights, m.total = append(m.routes, r), append(m.weights, w), m.total+w
}

// parseMix reads "api" (the catalogue's weights), or a comma-separated list
// of route names with optional weights: "activities=3,inbound".
func parseMix(s string) (mix, error) {
	var m mix
	if s = strings.TrimSpace(s); s == "api" {
		for _, r := range catalogue {
			if r.weight > 0 {
				m.add(r, r.weight)
			}
		}
		return m, nil
	} else if s == "" {
		return m, errors.New(`empty route mix: use "api" or route names`)
	}
	for part := range strings.SplitSeq(s, ",") {
		name, ws, hasWeight := strings.Cut(strings.TrimSpace(part), "=")
		r, ok := findRoute(name)
		if !ok {
			names := make([]string, len(catalogue))
			for i, r := range catalogue {
				names[i] = r.name
			}
			return mix{}, fmt.Errorf("unknown route %q (routes: %s)", name, strings.Join(names, ", "))
		}
		if slices.ContainsFunc(m.routes, func(r route) bool { return r.name == name }) {
			return mix{}, fmt.Errorf("route %q named twice", name)
		}
		w, err := strconv.Atoi(cmp.Or(ws, "1"))
		if err != nil || w < 1 || w > 1_000_000 || hasWeight && ws == "" {
			return mix{}, fmt.Errorf("route %q: weight %q is not a whole number from 1 to 1000000", name, ws)
		}
		m.add(r, w)
	}
	return m, nil
}

// pick draws a route: one number below the total weight, unless the mix
// has a single route (the request stream depends on it: keep the draws).
func (m mix) pick(rng *rand.Rand) route {
	if len(m.routes) == 1 {
		return m.routes[0]
	}
	n := rng.IntN(m.total)
	for i, w := range m.weights {
		if n -= w; n < 0 {
			return m.routes[i]
		}
	}
	panic("unreachable: n < total")
}

func (m mix) String() string {
	parts := make([]string, len(m.routes))
	for i, r := range m.routes {
		parts[i] = fmt.Sprintf("%s=%d", r.name, m.weights[i])
	}
	return strings.Join(parts, ",")
}

// Key popularity.
const (
	keysUniform = "uniform" // every key of the population equally likely
	keysZipf    = "zipf"    // key of rank k with probability ∝ 1/(k+1)^s
	keysUnique  = "unique"  // every request a key never used before
)

// keySpec says how keys are drawn.
type keySpec struct {
	dist     string  // keysUniform, keysZipf or keysUnique
	zipfS    float64 // > 1
	tenants  uint64
	channels uint64
	ips      uint64
	accounts uint64
	prefix   string // prepended to tenant, channel and account keys
}

func (k keySpec) validate() error {
	switch {
	case k.dist != keysUniform && k.dist != keysZipf && k.dist != keysUnique:
		return fmt.Errorf("--keys %q: use uniform, zipf or unique", k.dist)
	case k.dist == keysZipf && (!(k.zipfS > 1) || k.zipfS > 10):
		return fmt.Errorf("--zipf-s %v: must be above 1 and at most 10", k.zipfS)
	case k.ips > 1<<24:
		return fmt.Errorf("--ips %d: at most %d (client IPs are drawn from 10.0.0.0/8)", k.ips, 1<<24)
	case len(k.prefix) > 64:
		return errors.New("--key-prefix: at most 64 bytes")
	}
	for i, n := range []uint64{k.tenants, k.channels, k.ips, k.accounts} {
		if n < 1 || n > maxPopulation {
			return fmt.Errorf("--%s %d: must be from 1 to %d", [...]string{"tenants", "channels", "ips", "accounts"}[i], n, maxPopulation)
		}
	}
	return nil
}

const maxPopulation = 1 << 32

func (k keySpec) String() string {
	s := k.dist
	if k.dist == keysZipf {
		s += fmt.Sprintf("(s=%g)", k.zipfS)
	}
	if k.dist != keysUnique {
		s += fmt.Sprintf(" tenants=%d channels=%d ips=%d accounts=%d", k.tenants, k.channels, k.ips, k.accounts)
	}
	return s
}

// picker draws key indices in [0, n) from rng (keysUnique draws none:
// the generator numbers its requests). Each worker has its own.
func (k keySpec) picker(rng *rand.Rand, n uint64) func() uint64 {
	if k.dist == keysZipf {
		// v = 1: rank 0 has weight 1, rank k 1/(k+1)^s.
		return rand.NewZipf(rng, k.zipfS, 1, n-1).Uint64
	}
	return func() uint64 { return rng.Uint64N(n) }
}

// request is one HTTP request of the example API, as the client sends it
// (ext_authz sees it after Envoy added its headers).
type request struct {
	route    string
	method   string
	path     string
	clientIP string
	headers  map[string]string // lowercase names, no pseudo-headers
	body     string
}

// generator makes requests. One per worker; not safe for concurrent use.
type generator struct {
	mix                          mix
	keys                         keySpec
	rng                          *rand.Rand
	tenant, channel, ip, account func() uint64
	unique                       *atomic.Uint64 // keysUnique: the shared sequence
}

// newGenerator returns worker w's generator; seq is shared by the workers
// of a run so that unique keys stay unique across them.
func newGenerator(m mix, k keySpec, seed uint64, w int, seq *atomic.Uint64) *generator {
	rng := rand.New(rand.NewPCG(seed, uint64(w)+1))
	return &generator{mix: m, keys: k, rng: rng, unique: seq, tenant: k.picker(rng, k.tenants),
		channel: k.picker(rng, k.channels), ip: k.picker(rng, k.ips), account: k.picker(rng, k.accounts)}
}

var userAgents = []string{
	"converger-sdk-go/2.3.1",
	"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Safari/537.36",
	"okhttp/4.12.0",
	"python-requests/2.32.3",
}

// next returns a new request.
func (g *generator) next() request {
	r := g.mix.pick(g.rng)
	var tenant, channel, ip, account uint64
	if g.keys.dist == keysUnique {
		// One fresh index per request, shared by every key of it.
		n := g.unique.Add(1) - 1
		tenant, channel, ip, account = n, n, n, n
	} else {
		tenant, channel, ip, account = g.tenant(), g.channel(), g.ip(), g.account()
	}
	req := request{
		route:    r.name,
		method:   "POST",
		path:     r.path,
		clientIP: ipKey(ip),
		headers: map[string]string{
			"user-agent": userAgents[g.rng.IntN(len(userAgents))],
			"accept":     "application/json",
		},
	}
	if r.name == "unmatched" {
		req.method = "GET"
		delete(req.headers, "accept")
	}
	if strings.Contains(r.path, "{channel}") {
		req.path = strings.Replace(r.path, "{channel}", g.keys.prefix+"ch-"+strconv.FormatUint(channel, 10), 1)
	}
	if r.tenant {
		req.headers["x-tenant-id"] = g.keys.prefix + "tenant-" + strconv.FormatUint(tenant, 10)
	}
	if req.method == "POST" {
		req.headers["content-type"] = "application/json"
		req.body = `{"type":"message","text":"hello"}`
	}
	if r.login {
		req.body = `{"email":"` + g.keys.prefix + "user" + strconv.FormatUint(account, 10) + `@example.com","password":"not-the-password"}`
	}
	return req
}

// ipKey maps index n to a client IPv4 in 10.0.0.0/8 (n mod 2^24).
func ipKey(n uint64) string {
	return netip.AddrFrom4([4]byte{10, byte(n >> 16), byte(n >> 8), byte(n)}).String()
}
