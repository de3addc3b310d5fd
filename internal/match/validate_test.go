package match

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateTemplate(t *testing.T) {
	valid := []string{
		"/", "/api/activities", "/api/inbound/{channel}", "/api/inbound/{channel}/status",
		"/{a}/{b_2}/{_C}", "/a.b/c..d/...", "/v1/%20x/%2F", "/a-b~c_d/é",
	}
	for _, tpl := range valid {
		if err := ValidateTemplate(tpl); err != nil {
			t.Errorf("ValidateTemplate(%q) = %v, want nil", tpl, err)
		}
	}
	invalid := []struct{ tpl, problem string }{
		{"", "empty"},
		{"api/x", `does not start with "/"`},
		{"/api/x?y=1", "query string"},
		{"/api/x#y", "fragment"},
		{"/api/ x", "whitespace"},
		{"/api/x\t", "whitespace"},
		{"/api/\x00", "control"},
		{"/api\\x", `"\"`},
		{"/api/\xff", "UTF-8"},
		{"//api", "empty segment 1"},
		{"/api//x", "empty segment 2"},
		{"/api/x/", `ends with "/"`},
		{"/api/./x", `segment 2 is "."`},
		{"/api/..", `segment 2 is ".."`},
		{"/api/%2e%2E", "%2e"},
		{"/api/%41", "decodes"},
		{"/api/{}", "capture name"},
		{"/api/{1x}", "capture name"},
		{"/api/{a-b}", "capture name"},
		{"/api/{a}{b}", "capture name"},
		{"/api/{a}/x/{a}", "{a} appears twice"},
		{"/api/x{a}", `"{" and "}"`},
		{"/api/{a}x", `"{" and "}"`},
		{"/api/{a", `"{" and "}"`},
		{"/api/a}", `"{" and "}"`},
	}
	for _, tt := range invalid {
		err := ValidateTemplate(tt.tpl)
		if err == nil {
			t.Errorf("ValidateTemplate(%q) = nil, want an error about %s", tt.tpl, tt.problem)
			continue
		}
		if !errors.Is(err, ErrInvalidTemplate) || !strings.Contains(err.Error(), tt.problem) {
			t.Errorf("ValidateTemplate(%q) = %v, want ErrInvalidTemplate about %q", tt.tpl, err, tt.problem)
		}
	}
}

func TestNewErrors(t *testing.T) {
	tenant := Bucket{Name: "t", Key: KeySpec{Kind: KeyTenant}}
	ip := Bucket{Name: "ip", Key: KeySpec{Kind: KeyIP}}
	chn := Bucket{Name: "chn", Key: KeySpec{Kind: KeyPathParam, Name: "channel"}}
	tests := []struct {
		name string
		cfg  Config
		want []string // each must appear in the error
	}{
		{
			name: "invalid template names the route",
			cfg:  Config{Buckets: []Bucket{ip}, Routes: []Route{{Name: "ok", Template: "/a"}, {Name: "bad", Method: "POST", Template: "/a//b"}}},
			want: []string{`route 1 "bad" (POST "/a//b")`, "invalid route template", "empty segment"},
		},
		{
			name: "duplicate routes, capture names aside",
			cfg: Config{Buckets: []Bucket{chn}, Routes: []Route{
				{Method: "POST", Template: "/in/{channel}", Buckets: []int{0}},
				{Method: "POST", Template: "/in/{other}"},
			}},
			want: []string{`route 1 (POST "/in/{other}"): duplicate of route 0`},
		},
		{
			name: "same template, different method is fine but same method is not",
			cfg: Config{Routes: []Route{
				{Method: "POST", Template: "/x"}, {Template: "/x"}, {Method: "GET", Template: "/x"}, {Template: "/x"},
			}},
			want: []string{`route 3 (* "/x"): duplicate of route 1`},
		},
		{
			name: "path param the template does not capture",
			cfg:  Config{Buckets: []Bucket{ip, chn}, Routes: []Route{{Name: "hook", Method: "POST", Template: "/hooks/{id}", Buckets: []int{0, 1}}}},
			want: []string{`route 0 "hook" (POST "/hooks/{id}")`, `bucket 1 "chn" keys by path param "channel"`, "does not capture"},
		},
		{
			name: "bucket index out of range",
			cfg:  Config{Buckets: []Bucket{ip}, Routes: []Route{{Template: "/a", Buckets: []int{0, 1, 7}}}},
			want: []string{`route 0 (* "/a"): bucket index 1 out of range (1 buckets)`, "bucket index 7 out of range"},
		},
		{
			name: "bucket listed twice",
			cfg:  Config{Buckets: []Bucket{ip}, Routes: []Route{{Template: "/a", Buckets: []int{0, 0}}}},
			want: []string{`route 0 (* "/a"): lists bucket 0 "ip" more than once`},
		},
		{
			name: "unknown key kind",
			cfg:  Config{Buckets: []Bucket{{Name: "x", Key: KeySpec{Kind: 9}}}},
			want: []string{`bucket 0 "x": unknown key kind 9`},
		},
		{
			name: "negative hops",
			cfg:  Config{TrustedHops: -1},
			want: []string{"TrustedHops -1 is negative"},
		},
		{
			name: "tenant bucket without tenant header",
			cfg:  Config{Buckets: []Bucket{ip, tenant}},
			want: []string{`bucket 1 "t": keys by tenant but TenantHeader is empty`},
		},
		{
			name: "account bucket without a source",
			cfg:  Config{Buckets: []Bucket{{Name: "acct", Key: KeySpec{Kind: KeyAccount}}}},
			want: []string{`bucket 0 "acct": keys by account but neither AccountHeader nor AccountBodyField is set`},
		},
		{
			name: "header names not lowercase",
			cfg: Config{
				Buckets:       []Bucket{{Name: "h", Key: KeySpec{Kind: KeyHeader, Name: "X-Api-Key"}}, {Name: "e", Key: KeySpec{Kind: KeyHeader}}},
				TenantHeader:  "X-Tenant-ID",
				AccountHeader: "x-login account",
			},
			want: []string{`TenantHeader "X-Tenant-ID": not lowercase`, `AccountHeader "x-login account": invalid character ' '`, `bucket 0 "h": header name "X-Api-Key": not lowercase`, `bucket 1 "e": header name "": empty`},
		},
		{
			name: "bad path param name",
			cfg:  Config{Buckets: []Bucket{{Name: "p", Key: KeySpec{Kind: KeyPathParam, Name: "a-b"}}}},
			want: []string{`bucket 0 "p": path param name "a-b"`},
		},
		{
			name: "bucket names",
			cfg:  Config{Buckets: []Bucket{ip, {Key: KeySpec{Kind: KeyIP}}, ip, {Name: "a,b", Key: KeySpec{Kind: KeyIP}}}},
			want: []string{"bucket 1: empty name", `bucket 2 "ip": name already used by bucket 0`, `bucket 3 "a,b": name contains a comma`},
		},
		{
			name: "route methods",
			cfg:  Config{Routes: []Route{{Name: "r", Template: "/a"}, {Name: "r", Template: "/b"}, {Method: "get", Template: "/c"}, {Method: "PO ST", Template: "/d"}}},
			want: []string{`route 2 (get "/c"): method "get"`, `route 3 (PO ST "/d"): method "PO ST"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := New(tt.cfg)
			if err == nil {
				t.Fatalf("New = %v, nil; want an error", e)
			}
			if e != nil {
				t.Errorf("New returned an Engine with its error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

func TestNewReportsAllProblems(t *testing.T) {
	_, err := New(Config{
		Buckets:     []Bucket{{Name: "t", Key: KeySpec{Kind: KeyTenant}}},
		Routes:      []Route{{Template: "/a/"}, {Template: "/{x}/{x}"}, {Template: "/b", Buckets: []int{3}}},
		TrustedHops: -2,
	})
	if err == nil {
		t.Fatal("New = nil error")
	}
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("error %T is not a joined error", err)
	}
	if n := len(j.Unwrap()); n != 5 {
		t.Errorf("got %d problems, want 5:\n%v", n, err)
	}
	if !errors.Is(err, ErrInvalidTemplate) {
		t.Errorf("errors.Is(err, ErrInvalidTemplate) = false")
	}
}

func TestExampleConfigValid(t *testing.T) {
	if _, err := New(exampleConfig()); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{}); err != nil {
		t.Fatalf("New(Config{}) = %v", err)
	}
}
