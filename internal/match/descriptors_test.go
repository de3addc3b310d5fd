package match

import (
	"slices"
	"strings"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
)

// Bucket indexes of exampleConfig.
const (
	bActivity = iota
	bUpload
	bInbound
	bTokenGenerate
	bTokenCreate
	bLoginIP
	bLoginAccount
)

// Route indexes of exampleConfig.
const (
	rActivities = iota
	rConvergerActivities
	rUploads
	rInbound
	rInboundStatus
	rToken
	rTokenRefresh
	rTokens
	rAdminLogin
	rPortalLogin
)

// exampleConfig is the shipped default table of DESIGN.md.
func exampleConfig() Config {
	return Config{
		Buckets: []Bucket{
			bActivity:      {Name: "activity_create", Key: KeySpec{Kind: KeyTenant}},
			bUpload:        {Name: "upload", Key: KeySpec{Kind: KeyTenant}},
			bInbound:       {Name: "inbound", Key: KeySpec{Kind: KeyPathParam, Name: "channel"}},
			bTokenGenerate: {Name: "token_generate", Key: KeySpec{Kind: KeyPathParam, Name: "channel"}},
			bTokenCreate:   {Name: "token_create", Key: KeySpec{Kind: KeyIP}},
			bLoginIP:       {Name: "login_ip", Key: KeySpec{Kind: KeyIP}},
			bLoginAccount:  {Name: "login_account", Key: KeySpec{Kind: KeyAccount}},
		},
		Routes: []Route{
			rActivities:          {Name: "activity_create", Method: "POST", Template: "/api/activities", Buckets: []int{bActivity}},
			rConvergerActivities: {Method: "POST", Template: "/api/converger/activities", Buckets: []int{bActivity}},
			rUploads:             {Method: "POST", Template: "/api/converger/uploads", Buckets: []int{bUpload}},
			rInbound:             {Method: "POST", Template: "/api/inbound/{channel}", Buckets: []int{bInbound}},
			rInboundStatus:       {Method: "POST", Template: "/api/inbound/{channel}/status", Buckets: []int{bInbound}},
			rToken:               {Method: "POST", Template: "/api/converger/channels/{channel}/token", Buckets: []int{bTokenGenerate}},
			rTokenRefresh:        {Method: "POST", Template: "/api/converger/channels/{channel}/token/refresh", Buckets: []int{bTokenGenerate}},
			rTokens:              {Method: "POST", Template: "/api/v1/tokens", Buckets: []int{bTokenCreate}},
			rAdminLogin:          {Name: "admin_login", Method: "POST", Template: "/admin/login", Buckets: []int{bLoginIP, bLoginAccount}},
			rPortalLogin:         {Method: "POST", Template: "/portal/login", Buckets: []int{bLoginIP, bLoginAccount}},
		},
		TenantHeader:     "x-tenant-id",
		AccountHeader:    "x-login-account",
		AccountBodyField: "email",
	}
}

func mustNew(t testing.TB, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return e
}

// typicalHeaders is what Envoy sends for an ordinary API call.
func typicalHeaders() map[string]string {
	return map[string]string{
		":authority":        "api.example.com",
		":method":           "POST",
		":path":             "/api/activities",
		":scheme":           "https",
		"content-type":      "application/json",
		"content-length":    "42",
		"user-agent":        "curl/8.5.0",
		"accept":            "*/*",
		"x-request-id":      "0b6c3c1e-7d1a-4d7e-9b62-2f4d5f0f8a11",
		"x-forwarded-proto": "https",
		"x-tenant-id":       "tenant-42",
	}
}

func TestRouteMatching(t *testing.T) {
	e := mustNew(t, exampleConfig())
	type want struct {
		route int
		descs []Descriptor
	}
	tenant := []Descriptor{{Bucket: bActivity, Key: "tenant-42"}}
	login := []Descriptor{{Bucket: bLoginIP, Key: "192.0.2.10"}, {Bucket: bLoginAccount, Key: UnreadableAccount}}
	none := want{route: -1}
	tests := []struct {
		method, path string
		want         want
	}{
		// Every route, with what it should match.
		{"POST", "/api/activities", want{rActivities, tenant}},
		{"POST", "/api/converger/activities", want{rConvergerActivities, tenant}},
		{"POST", "/api/converger/uploads", want{rUploads, []Descriptor{{Bucket: bUpload, Key: "tenant-42"}}}},
		{"POST", "/api/inbound/abc123", want{rInbound, []Descriptor{{Bucket: bInbound, Key: "abc123"}}}},
		{"POST", "/api/inbound/abc123/status", want{rInboundStatus, []Descriptor{{Bucket: bInbound, Key: "abc123"}}}},
		{"POST", "/api/converger/channels/ch-9/token", want{rToken, []Descriptor{{Bucket: bTokenGenerate, Key: "ch-9"}}}},
		{"POST", "/api/converger/channels/ch-9/token/refresh", want{rTokenRefresh, []Descriptor{{Bucket: bTokenGenerate, Key: "ch-9"}}}},
		{"POST", "/api/v1/tokens", want{rTokens, []Descriptor{{Bucket: bTokenCreate, Key: "192.0.2.10"}}}},
		{"POST", "/admin/login", want{rAdminLogin, login}},
		{"POST", "/portal/login", want{rPortalLogin, login}},

		// POST only.
		{"GET", "/api/activities", none},
		{"GET", "/api/inbound/abc123", none},
		{"GET", "/admin/login", none},
		{"post", "/api/activities", none},
		{"", "/api/activities", none},

		// Query strings and fragments are ignored.
		{"POST", "/api/activities?x=1", want{rActivities, tenant}},
		{"POST", "/api/activities?", want{rActivities, tenant}},
		{"POST", "/api/activities#frag", want{rActivities, tenant}},
		{"POST", "/api/inbound/abc123?sig=/status", want{rInbound, []Descriptor{{Bucket: bInbound, Key: "abc123"}}}},
		{"POST", "/api/v1/tokens?a=../../admin/login", want{rTokens, []Descriptor{{Bucket: bTokenCreate, Key: "192.0.2.10"}}}},

		// Normalisation.
		{"POST", "//api///activities", want{rActivities, tenant}},
		{"POST", "/api/x/../activities", want{rActivities, tenant}},
		{"POST", "/api/./activities", want{rActivities, tenant}},
		{"POST", "/../../api/activities", want{rActivities, tenant}},
		{"POST", "/api/%61ctivities", want{rActivities, tenant}},
		{"POST", "/api/x/%2E%2e/activities", want{rActivities, tenant}},
		{"POST", `/api\activities`, want{rActivities, tenant}},
		{"POST", "/api/inbound//abc123//status", want{rInboundStatus, []Descriptor{{Bucket: bInbound, Key: "abc123"}}}},
		{"POST", "/api/inbound/%61bc%31%323", want{rInbound, []Descriptor{{Bucket: bInbound, Key: "abc123"}}}}, // one channel, one key
		{"POST", "/api/inbound/a%2Fb", want{rInbound, []Descriptor{{Bucket: bInbound, Key: "a%2Fb"}}}},         // %2F is kept, as Envoy keeps it
		{"POST", "/api/inbound/abc123/status/..", none},                                                        // "/api/inbound/abc123/" (trailing slash)
		{"POST", "/api/inbound/abc123/status/../", none},
		{"POST", "/admin/x/../login?next=/", want{rAdminLogin, login}},

		// Case-sensitive, trailing slash significant, nothing more or less.
		{"POST", "/API/activities", none},
		{"POST", "/api/Activities", none},
		{"POST", "/api/activities/", none},
		{"POST", "/api/activities/x", none},
		{"POST", "/api/activitiesx", none},
		{"POST", "/api", none},
		{"POST", "/", none},
		{"POST", "", none},
		{"POST", "*", none},
		{"POST", "api/activities", none},
		{"POST", "http://api.example.com/api/activities", none},
		{"POST", "/api/inbound", none},
		{"POST", "/api/inbound/", none},                     // capture needs a non-empty segment
		{"POST", "/api/inbound/abc123/", none},              // trailing slash
		{"POST", "/api/inbound/abc123/status/x", none},      // too long
		{"POST", "/api/inbound/abc123/other", none},         // wrong literal
		{"POST", "/api/converger/channels//token", none},    // merged to /api/converger/channels/token
		{"POST", "/api/converger/channels/c/token/x", none}, // not the refresh route
		{"POST", "/api/v1/tokens/", none},
		{"POST", "/admin/login/", none},
		{"POST", "/admin/Login", none},
		{"POST", "/portal", none},
		{"POST", "/other/login", none},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			r := &checkreq.Request{Method: tt.method, Path: tt.path, Headers: checkreq.AppendMap(nil, typicalHeaders(), nil), PeerAddress: "192.0.2.10"}
			got := e.Describe(r, nil)
			if got.Route != tt.want.route {
				t.Fatalf("Route = %d, want %d", got.Route, tt.want.route)
			}
			if !slices.Equal(got.Descriptors, tt.want.descs) {
				t.Errorf("Descriptors = %+v, want %+v", got.Descriptors, tt.want.descs)
			}
		})
	}
}

// TestTemplatesMatchNothingElse checks each template of the table against a
// sample path of every other route: it matches its own and no other.
func TestTemplatesMatchNothingElse(t *testing.T) {
	cfg := exampleConfig()
	samples := []string{
		rActivities:          "/api/activities",
		rConvergerActivities: "/api/converger/activities",
		rUploads:             "/api/converger/uploads",
		rInbound:             "/api/inbound/c1",
		rInboundStatus:       "/api/inbound/c1/status",
		rToken:               "/api/converger/channels/c1/token",
		rTokenRefresh:        "/api/converger/channels/c1/token/refresh",
		rTokens:              "/api/v1/tokens",
		rAdminLogin:          "/admin/login",
		rPortalLogin:         "/portal/login",
	}
	for i, r := range cfg.Routes {
		tpl, problem := parseTemplate(r.Template)
		if problem != "" {
			t.Fatalf("route %d: %s", i, problem)
		}
		for j, p := range samples {
			if got := tpl.match(p); got != (i == j) {
				t.Errorf("template %q matches %q = %v, want %v", r.Template, p, got, i == j)
			}
		}
	}
}

func TestFirstMatchWins(t *testing.T) {
	cfg := Config{
		Buckets: []Bucket{
			{Name: "a", Key: KeySpec{Kind: KeyIP}},
			{Name: "b", Key: KeySpec{Kind: KeyPathParam, Name: "x"}},
			{Name: "c", Key: KeySpec{Kind: KeyIP}},
		},
		Routes: []Route{
			{Method: "POST", Template: "/v1/special", Buckets: []int{0}},
			{Template: "/{x}/special", Buckets: []int{1}},
			{Template: "/v1/{y}", Buckets: []int{2}},
			{Template: "/", Buckets: []int{2}},
			{Template: "/v1/exempt", Buckets: nil}, // shadowed by route 2
		},
	}
	e := mustNew(t, cfg)
	for _, tt := range []struct {
		method, path string
		route        int
		key          string
	}{
		{"POST", "/v1/special", 0, "10.0.0.1"},
		{"GET", "/v1/special", 1, "v1"}, // route 1 comes before route 2
		{"GET", "/v2/special", 1, "v2"}, // first segment not indexed: capture routes only
		{"GET", "/v1/other", 2, "10.0.0.1"},
		{"GET", "/", 3, "10.0.0.1"},
		{"GET", "/v1", -1, ""},
		{"GET", "//", 3, "10.0.0.1"},
	} {
		got := e.Describe(&checkreq.Request{Method: tt.method, Path: tt.path, PeerAddress: "10.0.0.1"}, nil)
		if got.Route != tt.route {
			t.Errorf("%s %s: Route = %d, want %d", tt.method, tt.path, got.Route, tt.route)
			continue
		}
		if tt.route >= 0 && (len(got.Descriptors) != 1 || got.Descriptors[0].Key != tt.key) {
			t.Errorf("%s %s: Descriptors = %+v, want key %q", tt.method, tt.path, got.Descriptors, tt.key)
		}
	}
}

func TestExemptRoute(t *testing.T) {
	cfg := exampleConfig()
	cfg.Routes = append([]Route{{Method: "POST", Template: "/api/inbound/health"}}, cfg.Routes...)
	e := mustNew(t, cfg)
	got := e.Describe(&checkreq.Request{Method: "POST", Path: "/api/inbound/health"}, nil)
	if got.Route != 0 || len(got.Descriptors) != 0 {
		t.Errorf("got %+v, want route 0 and no descriptors", got)
	}
}

func TestMissingKeys(t *testing.T) {
	e := mustNew(t, exampleConfig())
	got := e.Describe(&checkreq.Request{Method: "POST", Path: "/api/activities"}, nil)
	want := []Descriptor{{Bucket: bActivity, Key: ""}}
	if got.Route != rActivities || !slices.Equal(got.Descriptors, want) {
		t.Errorf("no tenant header: got %+v, want route %d %+v", got, rActivities, want)
	}
	if got.ClientIP != "" {
		t.Errorf("ClientIP = %q without a peer, want \"\"", got.ClientIP)
	}
	got = e.Describe(&checkreq.Request{Method: "POST", Path: "/api/activities", Headers: checkreq.AppendMap(nil, map[string]string{"x-tenant-id": ""}, nil)}, nil)
	if !slices.Equal(got.Descriptors, want) {
		t.Errorf("empty tenant header: got %+v, want %+v", got.Descriptors, want)
	}
	got = e.Describe(&checkreq.Request{Method: "POST", Path: "/api/v1/tokens", PeerAddress: "/run/envoy.sock"}, nil)
	if want := []Descriptor{{Bucket: bTokenCreate}}; !slices.Equal(got.Descriptors, want) {
		t.Errorf("unix socket peer: got %+v, want %+v", got.Descriptors, want)
	}
	if e.Describe(nil, nil).Route != -1 {
		t.Error("nil request matched a route")
	}
}

func TestHeaderKey(t *testing.T) {
	e := mustNew(t, Config{
		Buckets: []Bucket{{Name: "by_host", Key: KeySpec{Kind: KeyHeader, Name: ":authority"}}, {Name: "by_key", Key: KeySpec{Kind: KeyHeader, Name: "x-api-key"}}},
		Routes:  []Route{{Template: "/{any}", Buckets: []int{0, 1}}},
	})
	got := e.Describe(&checkreq.Request{Method: "GET", Path: "/x", Headers: checkreq.AppendMap(nil, map[string]string{":authority": "a.example", "X-Api-Key": "ignored"}, nil)}, nil)
	want := []Descriptor{{Bucket: 0, Key: "a.example"}, {Bucket: 1, Key: ""}}
	if !slices.Equal(got.Descriptors, want) {
		t.Errorf("got %+v, want %+v", got.Descriptors, want)
	}
}

func TestDescriptorsAppendToDst(t *testing.T) {
	e := mustNew(t, exampleConfig())
	dst := []Descriptor{{Bucket: 99, Key: "keep"}}
	got := e.Describe(&checkreq.Request{Method: "POST", Path: "/api/activities", Headers: checkreq.AppendMap(nil, map[string]string{"x-tenant-id": "t"}, nil)}, dst)
	want := []Descriptor{{Bucket: 99, Key: "keep"}, {Bucket: bActivity, Key: "t"}}
	if !slices.Equal(got.Descriptors, want) {
		t.Errorf("got %+v, want %+v", got.Descriptors, want)
	}
}

func TestLongPath(t *testing.T) {
	e := mustNew(t, exampleConfig())
	long := "/api/inbound/" + strings.Repeat("a", maxPathBytes)
	got := e.Describe(&checkreq.Request{Method: "POST", Path: long}, nil)
	if got.Route != -1 || !got.PathTooLong || len(got.Descriptors) != 0 {
		t.Errorf("%d-byte path: got Route %d PathTooLong %v %+v, want -1, true, none", len(long), got.Route, got.PathTooLong, got.Descriptors)
	}
	// A long query string does not hide the route.
	got = e.Describe(&checkreq.Request{Method: "POST", Path: "/api/inbound/c1?pad=" + strings.Repeat("a", 2*maxPathBytes)}, nil)
	if got.Route != rInbound || got.PathTooLong {
		t.Errorf("long query: got Route %d PathTooLong %v, want %d, false", got.Route, got.PathTooLong, rInbound)
	}
	// Exactly at the limit still matches.
	seg := strings.Repeat("b", maxPathBytes-len("/api/inbound/"))
	got = e.Describe(&checkreq.Request{Method: "POST", Path: "/api/inbound/" + seg}, nil)
	if got.Route != rInbound || got.Descriptors[0].Key != seg {
		t.Errorf("path at the limit: got Route %d, want %d", got.Route, rInbound)
	}
}

func TestContextExtensions(t *testing.T) {
	e := mustNew(t, exampleConfig())
	hdr := map[string]string{"x-tenant-id": "t1", "x-login-account": " Alice@Example.COM "}
	tests := []struct {
		name    string
		method  string
		path    string
		ext     map[string]string
		route   int
		descs   []Descriptor
		unknown int
		unkRt   bool
		account string
	}{
		{
			name: "buckets replace the route's", method: "POST", path: "/api/activities",
			ext:   map[string]string{checkreq.ExtBuckets: "upload,token_create"},
			route: rActivities, descs: []Descriptor{{Bucket: bUpload, Key: "t1"}, {Bucket: bTokenCreate, Key: "198.51.100.7"}},
		},
		{
			name: "unknown names skipped and counted, blanks and duplicates ignored", method: "POST", path: "/nowhere",
			ext:   map[string]string{checkreq.ExtBuckets: " upload , nope,,upload, also_nope "},
			route: -1, descs: []Descriptor{{Bucket: bUpload, Key: "t1"}}, unknown: 2,
		},
		{
			name: "path params from the first template match, any method", method: "GET", path: "/api/inbound/c7/status",
			ext:   map[string]string{checkreq.ExtBuckets: "inbound,token_generate"},
			route: rInboundStatus, descs: []Descriptor{{Bucket: bInbound, Key: "c7"}, {Bucket: bTokenGenerate, Key: "c7"}},
		},
		{
			name: "path param missing without a matching template", method: "POST", path: "/hooks/c7",
			ext:   map[string]string{checkreq.ExtBuckets: "inbound"},
			route: -1, descs: []Descriptor{{Bucket: bInbound, Key: ""}},
		},
		{
			name: "path param missing when the matching template lacks it", method: "POST", path: "/api/activities",
			ext:   map[string]string{checkreq.ExtBuckets: "inbound"},
			route: rActivities, descs: []Descriptor{{Bucket: bInbound, Key: ""}},
		},
		{
			name: "empty list exempts", method: "POST", path: "/api/activities",
			ext:   map[string]string{checkreq.ExtBuckets: ""},
			route: rActivities, descs: nil,
		},
		{
			name: "account computed for a listed account bucket", method: "POST", path: "/x",
			ext:   map[string]string{checkreq.ExtBuckets: "login_account"},
			route: -1, descs: []Descriptor{{Bucket: bLoginAccount, Key: "alice@example.com"}}, account: "alice@example.com",
		},
		{
			name: "route by name applies whatever the path and method", method: "GET", path: "/login.php",
			ext:   map[string]string{checkreq.ExtRoute: "admin_login"},
			route: rAdminLogin, descs: []Descriptor{{Bucket: bLoginIP, Key: "198.51.100.7"}, {Bucket: bLoginAccount, Key: "alice@example.com"}}, account: "alice@example.com",
		},
		{
			name: "named route's template gives params when it matches", method: "PUT", path: "/api/activities",
			ext:   map[string]string{checkreq.ExtRoute: "activity_create", checkreq.ExtBuckets: "activity_create,inbound"},
			route: rActivities, descs: []Descriptor{{Bucket: bActivity, Key: "t1"}, {Bucket: bInbound, Key: ""}},
		},
		{
			name: "unknown route name falls back to path matching", method: "POST", path: "/api/activities",
			ext:   map[string]string{checkreq.ExtRoute: "nope"},
			route: rActivities, descs: []Descriptor{{Bucket: bActivity, Key: "t1"}}, unkRt: true,
		},
		{
			name: "empty route name is no override", method: "POST", path: "/api/activities",
			ext:   map[string]string{checkreq.ExtRoute: ""},
			route: rActivities, descs: []Descriptor{{Bucket: bActivity, Key: "t1"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := e.Describe(&checkreq.Request{Method: tt.method, Path: tt.path, Headers: checkreq.AppendMap(nil, hdr, nil), PeerAddress: "198.51.100.7", ContextExtensions: checkreq.AppendMap(nil, tt.ext, nil)}, nil)
			if got.Route != tt.route {
				t.Errorf("Route = %d, want %d", got.Route, tt.route)
			}
			if !slices.Equal(got.Descriptors, tt.descs) {
				t.Errorf("Descriptors = %+v, want %+v", got.Descriptors, tt.descs)
			}
			if got.UnknownBuckets != tt.unknown || got.UnknownRoute != tt.unkRt {
				t.Errorf("UnknownBuckets, UnknownRoute = %d, %v, want %d, %v", got.UnknownBuckets, got.UnknownRoute, tt.unknown, tt.unkRt)
			}
			if got.Account != tt.account {
				t.Errorf("Account = %q, want %q", got.Account, tt.account)
			}
		})
	}
}

// TestSharedRouteName covers one rule with several templates, as internal/configfile
// produces for "paths: [...]": ratelimit_route picks the member whose
// template matches the path.
func TestSharedRouteName(t *testing.T) {
	cfg := exampleConfig()
	cfg.Routes[rPortalLogin].Name = "admin_login"
	cfg.Buckets = append(cfg.Buckets, Bucket{Name: "by_site", Key: KeySpec{Kind: KeyPathParam, Name: "site"}})
	cfg.Routes = append(cfg.Routes, Route{Name: "site_login", Method: "POST", Template: "/sites/{site}/login", Buckets: []int{len(cfg.Buckets) - 1}},
		Route{Name: "site_login", Method: "POST", Template: "/s/{site}/signin", Buckets: []int{len(cfg.Buckets) - 1}})
	e := mustNew(t, cfg)
	for _, tt := range []struct {
		name, path string
		route      int
		key        string
	}{
		{"admin_login", "/portal/login", rPortalLogin, ""},
		{"admin_login", "/admin/login", rAdminLogin, ""},
		{"admin_login", "/elsewhere", rAdminLogin, ""},
		{"site_login", "/s/blue/signin", rPortalLogin + 2, "blue"},
		{"site_login", "/sites/red/login", rPortalLogin + 1, "red"},
		{"site_login", "/x", rPortalLogin + 1, ""},
	} {
		got := e.Describe(&checkreq.Request{Method: "GET", Path: tt.path, ContextExtensions: checkreq.AppendMap(nil, map[string]string{checkreq.ExtRoute: tt.name}, nil)}, nil)
		if got.Route != tt.route {
			t.Errorf("%s on %s: Route = %d, want %d", tt.name, tt.path, got.Route, tt.route)
		}
		if tt.name == "site_login" && (len(got.Descriptors) != 1 || got.Descriptors[0].Key != tt.key) {
			t.Errorf("%s on %s: Descriptors = %+v, want key %q", tt.name, tt.path, got.Descriptors, tt.key)
		}
	}
}

func TestAccountOnlyWhenNeeded(t *testing.T) {
	e := mustNew(t, exampleConfig())
	r := &checkreq.Request{Method: "POST", Path: "/api/activities", Headers: checkreq.AppendMap(nil, map[string]string{"x-login-account": "bob"}, nil)}
	if got := e.Describe(r, nil); got.Account != "" {
		t.Errorf("Account = %q on a route without an account bucket", got.Account)
	}
	r.Path = "/portal/login"
	if got := e.Describe(r, nil); got.Account != "bob" || got.Descriptors[1].Key != "bob" {
		t.Errorf("login route: Account = %q, Descriptors %+v", got.Account, got.Descriptors)
	}
}

func TestZeroEngine(t *testing.T) {
	var e Engine
	got := e.Describe(&checkreq.Request{Method: "GET", Path: "/x", PeerAddress: "10.1.2.3", ContextExtensions: checkreq.AppendMap(nil, map[string]string{checkreq.ExtBuckets: "a", checkreq.ExtRoute: "b"}, nil)}, nil)
	if got.Route != -1 || len(got.Descriptors) != 0 || got.ClientIP != "10.1.2.3" || got.UnknownBuckets != 1 || !got.UnknownRoute {
		t.Errorf("zero Engine: got %+v", got)
	}
}

func TestConfigNotAliased(t *testing.T) {
	cfg := exampleConfig()
	e := mustNew(t, cfg)
	cfg.Buckets[bActivity].Key = KeySpec{Kind: KeyIP}
	cfg.Routes[rActivities].Buckets[0] = bUpload
	got := e.Describe(&checkreq.Request{Method: "POST", Path: "/api/activities", Headers: checkreq.AppendMap(nil, map[string]string{"x-tenant-id": "t"}, nil)}, nil)
	if want := []Descriptor{{Bucket: bActivity, Key: "t"}}; !slices.Equal(got.Descriptors, want) {
		t.Errorf("after changing cfg: got %+v, want %+v", got.Descriptors, want)
	}
}
