package match

import (
	"fmt"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
)

func activityRequest() *checkreq.Request {
	return &checkreq.Request{Method: "POST", Path: "/api/activities", Headers: checkreq.AppendMap(nil, typicalHeaders(), nil), PeerAddress: "10.0.3.7"}
}

func inboundRequest() *checkreq.Request {
	h := typicalHeaders()
	delete(h, "x-tenant-id")
	h[":path"] = "/api/inbound/abc123?sig=f00"
	h["x-forwarded-for"] = "198.51.100.23, 10.0.3.7"
	return &checkreq.Request{Method: "POST", Path: "/api/inbound/abc123?sig=f00", Headers: checkreq.AppendMap(nil, h, nil), PeerAddress: "10.0.3.7"}
}

func loginRequest() *checkreq.Request {
	h := typicalHeaders()
	delete(h, "x-tenant-id")
	h[":path"] = "/admin/login"
	h["x-forwarded-for"] = "198.51.100.23, 10.0.3.7"
	h["x-envoy-external-address"] = "198.51.100.23"
	h["x-envoy-auth-partial-body"] = "false" // Envoy sets it on every buffered body
	body := `{"email":"alice@example.com","password":"correct horse battery staple","remember":true}`
	h["content-length"] = fmt.Sprint(len(body))
	return &checkreq.Request{Method: "POST", Path: "/admin/login", Headers: checkreq.AppendMap(nil, h, nil), PeerAddress: "10.0.3.7", Body: body}
}

func noMatchRequest() *checkreq.Request {
	h := typicalHeaders()
	h[":method"] = "GET"
	h[":path"] = "/api/activities/123"
	return &checkreq.Request{Method: "GET", Path: "/api/activities/123", Headers: checkreq.AppendMap(nil, h, nil), PeerAddress: "10.0.3.7"}
}

func benchConfig() Config {
	cfg := exampleConfig()
	cfg.TrustedHops = 1
	cfg.UseExternalAddressHeader = true
	return cfg
}

// TestDescribeAllocs guards the hot-path budget: no allocation for typical
// requests when dst has room.
func TestDescribeAllocs(t *testing.T) {
	e := mustNew(t, benchConfig())
	dst := make([]Descriptor, 0, 8)
	for _, tt := range []struct {
		name  string
		r     *checkreq.Request
		route int
	}{
		{"activity", activityRequest(), rActivities},
		{"inbound", inboundRequest(), rInbound},
		{"login JSON", loginRequest(), rAdminLogin},
		{"no match", noMatchRequest(), -1},
	} {
		got := e.Describe(tt.r, dst)
		if got.Route != tt.route {
			t.Fatalf("%s: Route = %d, want %d", tt.name, got.Route, tt.route)
		}
		if got.AccountUnreadable {
			t.Fatalf("%s: the account must be read, or the budget measures a shortcut", tt.name)
		}
		if n := testing.AllocsPerRun(1000, func() { e.Describe(tt.r, dst) }); n != 0 {
			t.Errorf("%s: Describe allocates %v times per call, want 0", tt.name, n)
		}
		// As the caller does it: the Request and the descriptor array on
		// its stack. Neither may escape through Describe.
		src := *tt.r
		if n := testing.AllocsPerRun(1000, func() { describeOnStack(e, &src) }); n != 0 {
			t.Errorf("%s: checkreq.Request or dst escape to the heap: %v allocs per call", tt.name, n)
		}
	}
}

//go:noinline
func describeOnStack(e *Engine, src *checkreq.Request) int {
	in := checkreq.Request{
		Method:            src.Method,
		Path:              src.Path,
		Headers:           src.Headers,
		PeerAddress:       src.PeerAddress,
		Body:              src.Body,
		ContextExtensions: src.ContextExtensions,
	}
	var buf [8]Descriptor
	res := e.Describe(&in, buf[:0])
	return len(res.Descriptors) + len(res.ClientIP) + len(res.Account)
}

func BenchmarkDescribe(b *testing.B) {
	e := mustNew(b, benchConfig())
	for _, bb := range []struct {
		name string
		r    *checkreq.Request
	}{
		{"activity", activityRequest()},
		{"inbound", inboundRequest()},
		{"login_json", loginRequest()},
		{"no_match", noMatchRequest()},
	} {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				dst := make([]Descriptor, 0, 8)
				for pb.Next() {
					e.Describe(bb.r, dst)
				}
			})
		})
	}
}

// BenchmarkDescribeSerial is the single-goroutine cost, with a path that
// needs normalising for comparison.
func BenchmarkDescribeSerial(b *testing.B) {
	e := mustNew(b, benchConfig())
	norm := inboundRequest()
	norm.Path = "//api/inbound/./abc123?sig=f00"
	for _, bb := range []struct {
		name string
		r    *checkreq.Request
	}{
		{"activity", activityRequest()},
		{"inbound", inboundRequest()},
		{"login_json", loginRequest()},
		{"no_match", noMatchRequest()},
		{"inbound_normalise", norm},
	} {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			dst := make([]Descriptor, 0, 8)
			for b.Loop() {
				e.Describe(bb.r, dst)
			}
		})
	}
}

// BenchmarkManyRoutes shows what the first-segment index buys with 200
// routes spread over 20 first segments.
func BenchmarkManyRoutes(b *testing.B) {
	cfg := Config{Buckets: []Bucket{{Name: "ip", Key: KeySpec{Kind: KeyIP}}}}
	for i := range 200 {
		cfg.Routes = append(cfg.Routes, Route{Method: "POST", Template: fmt.Sprintf("/s%d/r%d/{id}", i%20, i), Buckets: []int{0}})
	}
	e := mustNew(b, cfg)
	r := &checkreq.Request{Method: "POST", Path: "/s19/r199/x", PeerAddress: "10.0.0.1"}
	if e.Describe(r, nil).Route != 199 {
		b.Fatal("no match")
	}
	b.ReportAllocs()
	dst := make([]Descriptor, 0, 8)
	for b.Loop() {
		e.Describe(r, dst)
	}
}
