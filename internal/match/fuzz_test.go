package match

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
)

// FuzzDescribe checks that Describe never panics on hostile input and that
// what it returns is consistent.
func FuzzDescribe(f *testing.F) {
	f.Add("POST", "/api/inbound/abc123?x=1", "198.51.100.1, 203.0.113.128", "", "203.0.113.128", "application/json", `{"email":"a@b"}`, "", "")
	f.Add("POST", "//admin/./login", "", "2001:db8::1", "::1", "application/x-www-form-urlencoded", "email=A%40b&email=a@b", "", "admin_login")
	f.Add("GET", "/api/converger/channels/c/token/refresh", "x,,y", "bogus", "", "", "", "inbound,nope,,token_generate", "")
	f.Add("POST", "/%2e%2E/api\\activities#x", ",,,", "", "fe80::1%eth0", "application/json", `{"email":[{"a":`, "login_account", "nope")
	e, err := New(exampleConfig())
	if err != nil {
		f.Fatal(err)
	}
	cfg := exampleConfig()
	cfg.TrustedHops = 2
	cfg.UseExternalAddressHeader = true
	e2, err := New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	cfg.AccountBodyField = ""
	cfg.AccountHeader = ""
	cfg.Buckets = cfg.Buckets[:bLoginIP+1]
	cfg.Routes = cfg.Routes[:rAdminLogin]
	e3, err := New(cfg) // wants no body
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, method, path, xff, ext, peer, ct, body, buckets, route string) {
		r := &checkreq.Request{
			Method: method,
			Path:   path,
			Headers: checkreq.Fields{
				{Name: "x-forwarded-for", Value: xff},
				{Name: "x-envoy-external-address", Value: ext},
				{Name: "content-type", Value: ct},
				{Name: "x-tenant-id", Value: xff},
				{Name: "x-login-account", Value: ext},
			},
			PeerAddress: peer,
			Body:        body,
		}
		if buckets != "" {
			r.ContextExtensions = r.ContextExtensions.Set(checkreq.ExtBuckets, buckets)
		}
		if route != "" {
			r.ContextExtensions = r.ContextExtensions.Set(checkreq.ExtRoute, route)
		}
		for _, e := range []*Engine{e, e2, e3} {
			res := e.Describe(r, nil)
			if res.Route < -1 || res.Route >= len(e.routes) {
				t.Fatalf("Route %d out of range", res.Route)
			}
			perBucket := map[int]int{}
			for _, d := range res.Descriptors {
				if int(d.Bucket) >= len(e.buckets) {
					t.Fatalf("descriptor bucket %d out of range", d.Bucket)
				}
				perBucket[d.Bucket]++
				switch e.buckets[d.Bucket].Key.Kind {
				case KeyPathParam:
					if strings.Contains(d.Key, "/") {
						t.Fatalf("path param key %q holds a slash", d.Key)
					}
				case KeyAccount:
					// Never "no account": a login counts against what it
					// presents or under the shared key.
					if d.Key == "" {
						t.Fatalf("account descriptor without a key: %+v", res.Descriptors)
					}
					if d.Key != UnreadableAccount && d.Key != normAccount(d.Key) {
						t.Fatalf("account key %q is not normalised", d.Key)
					}
				}
			}
			for b, n := range perBucket {
				max := 1
				if e.buckets[b].Key.Kind == KeyAccount {
					max = MaxAccounts + 1
				}
				if n > max {
					t.Fatalf("bucket %d has %d descriptors, at most %d", b, n, max)
				}
			}
			if res.Route >= 0 && buckets == "" && len(perBucket) != len(e.routes[res.Route].buckets) {
				t.Fatalf("route %d has %d buckets, got descriptors for %d", res.Route, len(e.routes[res.Route].buckets), len(perBucket))
			}
			if res.ClientIP != "" {
				if ip, ok := canonicalIP(res.ClientIP); !ok || ip != res.ClientIP {
					t.Fatalf("ClientIP %q is not a canonical IP", res.ClientIP)
				}
			}
			if res.Account != strings.ToLower(strings.TrimSpace(res.Account)) {
				t.Fatalf("Account %q is not normalised", res.Account)
			}
			// Only the headers the Engine names, and the body only when it
			// wants one, decide: the decoder keeps nothing else.
			lean := *r
			lean.Headers = nil
			for _, h := range r.Headers {
				if slices.Contains(e.HeaderNames(), h.Name) {
					lean.Headers = append(lean.Headers, h)
				}
			}
			if !e.WantsBody() {
				lean.Body = ""
			}
			if got := e.Describe(&lean, nil); !reflect.DeepEqual(got, res) {
				t.Fatalf("with only HeaderNames %q: %+v, with every header %+v", e.HeaderNames(), got, res)
			}
			again := e.Describe(r, make([]Descriptor, 0, 4))
			if again.Route != res.Route || again.ClientIP != res.ClientIP || again.Account != res.Account || len(again.Descriptors) != len(res.Descriptors) {
				t.Fatalf("Describe is not deterministic: %+v then %+v", res, again)
			}
		}
	})
}
