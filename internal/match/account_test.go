package match

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
)

func TestAccount(t *testing.T) {
	const (
		form = "application/x-www-form-urlencoded"
		js   = "application/json"
	)
	huge := `{"email":"alice@example.com","pad":"` + strings.Repeat("x", maxBodyBytes) + `"}`
	u := []string{UnreadableAccount}
	tests := []struct {
		name    string
		header  string // x-login-account
		ct      string
		body    string
		partial string   // x-envoy-auth-partial-body; "false" (as Envoy sends it) when empty, absent when "-"
		cl      string   // content-length; absent when empty
		want    []string // the keys of the account bucket, in order
	}{
		{name: "header", header: "Alice@Example.com", want: []string{"alice@example.com"}},
		{name: "header trimmed", header: "  bob  ", want: []string{"bob"}},
		{name: "header and body both count", header: "bob", ct: js, body: `{"email":"alice"}`, want: []string{"bob", "alice"}},
		{name: "header and body agree", header: "Alice", ct: js, body: `{"email":"alice"}`, want: []string{"alice"}},
		{name: "blank header is unreadable, the body still counts", header: "  ", ct: js, body: `{"email":"alice"}`, want: []string{"alice", UnreadableAccount}},
		{name: "repeated header (Envoy joins with a comma)", header: "decoy@x,alice", ct: js, body: `{"email":"alice"}`, want: []string{"alice", UnreadableAccount}},
		{name: "decoy header, unreadable body", header: "decoy", ct: js, body: `{"email":"alice","email":"bob"}`, want: []string{"decoy", UnreadableAccount}},
		{name: "header not UTF-8", header: "al\xffice", want: u},

		{name: "form", ct: form, body: "email=Alice%40Example.com&password=secret", want: []string{"alice@example.com"}},
		{name: "form plus is a space, trimmed", ct: form, body: "password=x&email=+alice+", want: []string{"alice"}},
		{name: "form with charset", ct: "Application/X-WWW-Form-Urlencoded; charset=UTF-8", body: "email=alice", want: []string{"alice"}},
		{name: "form escaped key", ct: form, body: "e%6Dail=alice", want: []string{"alice"}},
		{name: "form other fields only", ct: form, body: "emails=x&user=alice&email2=y", want: u},
		{name: "form key without value", ct: form, body: "email&x=1", want: u},
		{name: "form empty value", ct: form, body: "email=&x=1", want: u},
		{name: "form repeated, same account", ct: form, body: "email=alice&email=ALICE", want: []string{"alice"}},
		{name: "form repeated, different accounts", ct: form, body: "email=alice&email=victim", want: u},
		{name: "form bad escape", ct: form, body: "email=alice&x=%zz", want: u},
		{name: "form escaped bytes not UTF-8", ct: form, body: "email=al%FFice", want: u},

		{name: "JSON", ct: js, body: `{"email": "Alice@Example.com", "password": "x"}`, want: []string{"alice@example.com"}},
		{name: "JSON with charset", ct: "application/json; charset=utf-8", body: `{"email":"alice"}`, want: []string{"alice"}},
		{name: "JSON whitespace", ct: js, body: " \n{ \"password\" : [1, {\"email\": \"nested\"}], \"email\" :\t\"alice\" } \r\n", want: []string{"alice"}},
		{name: "JSON escapes", ct: js, body: `{"email":"al\u0069ce\u0040example.com"}`, want: []string{"alice@example.com"}},
		{name: "JSON escaped key", ct: js, body: `{"em\u0061il":"alice"}`, want: []string{"alice"}},
		{name: "JSON surrogate pair", ct: js, body: `{"email":"\ud83d\ude00@x"}`, want: []string{"\U0001F600@x"}},
		{name: "JSON key case-insensitive like encoding/json", ct: js, body: `{"Email":"alice"}`, want: []string{"alice"}},
		{name: "JSON keys differing in case disagree", ct: js, body: `{"email":"alice","EMAIL":"victim"}`, want: u},
		{name: "JSON duplicate disagrees", ct: js, body: `{"email":"alice","email":"victim"}`, want: u},
		{name: "JSON duplicate agrees", ct: js, body: `{"email":"alice","email":" Alice "}`, want: []string{"alice"}},
		{name: "JSON nested only", ct: js, body: `{"user":{"email":"alice"}}`, want: u},
		{name: "JSON not a string", ct: js, body: `{"email":42}`, want: u},
		{name: "JSON null", ct: js, body: `{"email":"alice","email":null}`, want: u},
		{name: "JSON array top level", ct: js, body: `[{"email":"alice"}]`, want: u},
		{name: "JSON empty string", ct: js, body: `{"email":""}`, want: u},
		{name: "JSON malformed: truncated", ct: js, body: `{"email":"alice"`, want: u},
		{name: "JSON malformed: trailing garbage", ct: js, body: `{"email":"alice"} x`, want: u},
		{name: "JSON malformed: trailing comma", ct: js, body: `{"email":"alice",}`, want: u},
		{name: "JSON malformed: bad escape", ct: js, body: `{"email":"al\ice"}`, want: u},
		{name: "JSON malformed: control char", ct: js, body: "{\"email\":\"al\nice\"}", want: u},
		{name: "JSON malformed: bad number", ct: js, body: `{"n":01,"email":"alice"}`, want: u},
		{name: "JSON malformed: single quotes", ct: js, body: `{'email':'alice'}`, want: u},
		{name: "JSON too deep", ct: js, body: `{"email":"alice","x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, want: u},
		{name: "JSON not UTF-8", ct: js, body: "{\"email\":\"al\xffice\"}", want: u},
		{name: "JSON not UTF-8 elsewhere", ct: js, body: "{\"email\":\"alice\",\"x\":\"\xc3\"}", want: u},
		{name: "huge body", ct: js, body: huge, want: u},
		{name: "partial body", ct: js, body: `{"email":"alice"}`, partial: "true", want: u},
		{name: "complete body flag", ct: js, body: `{"email":"alice"}`, partial: "false", want: []string{"alice"}},
		{name: "no partial-body flag: not from Envoy's buffer", ct: js, body: `{"email":"alice"}`, partial: "-", want: u},
		{name: "client's flag joined to Envoy's", ct: js, body: `{"email":"alice"}`, partial: "false,true", want: u},
		{name: "content-length matches", ct: js, body: `{"email":"alice"}`, cl: "17", want: []string{"alice"}},
		{name: "body shorter than content-length", ct: js, body: `{"email":"alice"}`, cl: "9000", want: u},
		{name: "content-length not a number", ct: js, body: `{"email":"alice"}`, cl: "x", want: u},

		{name: "no content type", body: `{"email":"alice"}`, want: u},
		{name: "other content type", ct: "text/plain", body: "email=alice", want: u},
		{name: "content type prefix only", ct: "application/jsonx", body: `{"email":"alice"}`, want: u},
		{name: "no body", ct: js, want: u},
		{name: "nothing", want: u},
	}
	e := mustNew(t, exampleConfig())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := map[string]string{}
			if tt.header != "" {
				h["x-login-account"] = tt.header
			}
			if tt.ct != "" {
				h["content-type"] = tt.ct
			}
			switch tt.partial {
			case "":
				h["x-envoy-auth-partial-body"] = "false"
			case "-":
			default:
				h["x-envoy-auth-partial-body"] = tt.partial
			}
			if tt.cl != "" {
				h["content-length"] = tt.cl
			}
			got := e.Describe(&checkreq.Request{Method: "POST", Path: "/admin/login", Headers: checkreq.AppendMap(nil, h, nil), Body: tt.body, PeerAddress: "192.0.2.1"}, nil)
			wantAccount := ""
			if tt.want[0] != UnreadableAccount {
				wantAccount = tt.want[0]
			}
			if got.Account != wantAccount {
				t.Errorf("Account = %q, want %q", got.Account, wantAccount)
			}
			if unreadable := slices.Contains(tt.want, UnreadableAccount); got.AccountUnreadable != unreadable {
				t.Errorf("AccountUnreadable = %v, want %v", got.AccountUnreadable, unreadable)
			}
			var keys []string
			for _, d := range got.Descriptors {
				if d.Bucket == bLoginAccount {
					keys = append(keys, d.Key)
				}
			}
			if !slices.Equal(keys, tt.want) {
				t.Errorf("account keys = %q, want %q", keys, tt.want)
			}
		})
	}
}

func TestAccountSources(t *testing.T) {
	body := `{"email":"alice"}`
	h := map[string]string{"content-type": "application/json", "x-login-account": "bob", "x-envoy-auth-partial-body": "false"}
	for _, tt := range []struct {
		header, field string
		want          []string
	}{
		{"x-login-account", "email", []string{"bob", "alice"}},
		{"", "email", []string{"alice"}},
		{"x-login-account", "", []string{"bob"}},
		{"x-other", "", []string{UnreadableAccount}},
		{"", "login", []string{UnreadableAccount}},
	} {
		e := mustNew(t, Config{
			Buckets:          []Bucket{{Name: "acct", Key: KeySpec{Kind: KeyAccount}}},
			Routes:           []Route{{Template: "/login", Buckets: []int{0}}},
			AccountHeader:    tt.header,
			AccountBodyField: tt.field,
		})
		got := e.Describe(&checkreq.Request{Method: "POST", Path: "/login", Headers: checkreq.AppendMap(nil, h, nil), Body: body}, nil)
		var keys []string
		for _, d := range got.Descriptors {
			keys = append(keys, d.Key)
		}
		if !slices.Equal(keys, tt.want) {
			t.Errorf("header %q field %q: keys %q, want %q", tt.header, tt.field, keys, tt.want)
		}
	}
}

// TestAccountBound: a request counts against at most MaxAccounts accounts;
// one presenting more also counts under the shared key, so piling up
// decoys cannot push the real account out.
func TestAccountBound(t *testing.T) {
	e := mustNew(t, Config{
		Buckets:          []Bucket{{Name: "acct", Key: KeySpec{Kind: KeyAccount}}},
		Routes:           []Route{{Template: "/login", Buckets: []int{0}}},
		AccountHeader:    "x-login-account",
		AccountBodyField: "email",
	})
	var set accountSet
	for i := range MaxAccounts + 3 {
		set.add(fmt.Sprintf("a%d", i))
	}
	if set.n != MaxAccounts || !set.unreadable {
		t.Errorf("after %d accounts: n %d unreadable %v, want %d true", MaxAccounts+3, set.n, set.unreadable, MaxAccounts)
	}
	// Through Describe: a header and a body account fill the set; more
	// copies of either are unreadable, so the shared key joins them.
	h := map[string]string{"content-type": "application/x-www-form-urlencoded", "x-login-account": "decoy", "x-envoy-auth-partial-body": "false"}
	got := e.Describe(&checkreq.Request{Method: "POST", Path: "/login", Headers: checkreq.AppendMap(nil, h, nil), Body: "email=victim"}, nil)
	if len(got.Descriptors) != 2 || got.AccountUnreadable {
		t.Errorf("header and body: descriptors %+v", got.Descriptors)
	}
	h["x-login-account"] = "decoy1,decoy2,decoy3"
	got = e.Describe(&checkreq.Request{Method: "POST", Path: "/login", Headers: checkreq.AppendMap(nil, h, nil), Body: "email=victim&email=d4&email=d5"}, nil)
	want := []Descriptor{{0, UnreadableAccount}}
	if !slices.Equal(got.Descriptors, want) {
		t.Errorf("copies of both: descriptors %+v, want %+v", got.Descriptors, want)
	}
}

// FuzzJSONAccount cross-checks the JSON scanner with encoding/json: an
// account is only found in a document encoding/json accepts, and every
// top-level member encoding/json would decode into the field holds it.
func FuzzJSONAccount(f *testing.F) {
	for _, s := range []string{
		`{"email":"a"}`, `{"Email":"a","x":[1,2,{"y":null}]}`, `{"email":"\u00e9"}`, `{"email":"a","email":"b"}`,
		`{"email":1e5}`, `{"em\u0061il":"a\"b"}`, `{}`, `[]`, `{"email":"\ud800"}`, `{"n":-0.5e+3,"email":"a"}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		got, _ := jsonAccount(body, "email")
		if got == "" {
			return
		}
		if !json.Valid([]byte(body)) {
			t.Fatalf("jsonAccount(%q) = %q, but encoding/json rejects the document", body, got)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatalf("jsonAccount(%q) = %q, but it is no object: %v", body, got, err)
		}
		found := false
		for k, raw := range m {
			if !strings.EqualFold(k, "email") {
				continue
			}
			var v string
			if err := json.Unmarshal(raw, &v); err != nil {
				t.Fatalf("jsonAccount(%q) = %q, but member %q is %s", body, got, k, raw)
			}
			if normAccount(v) != got {
				t.Fatalf("jsonAccount(%q) = %q, but member %q is %q", body, got, k, v)
			}
			found = true
		}
		if !found {
			t.Fatalf("jsonAccount(%q) = %q, but encoding/json finds no such member", body, got)
		}
		// And the Go struct decoding an application would do agrees.
		var s struct {
			Email string `json:"email"`
		}
		if err := json.Unmarshal([]byte(body), &s); err != nil || normAccount(s.Email) != got {
			t.Fatalf("jsonAccount(%q) = %q, struct decoding gives %q, %v", body, got, s.Email, err)
		}
	})
}

// A body of many escaped decoy keys costs no more allocations than the
// same login without them: a key too long to be the field is not unescaped.
func TestJSONDecoyKeysDoNotAllocate(t *testing.T) {
	plain := `{"email":"alice@example.com"}`
	var b strings.Builder
	b.WriteString("{")
	for i := range 1000 {
		fmt.Fprintf(&b, `"\u0065mail-decoy-%04d-padding-padding-padding":0,`, i)
	}
	b.WriteString(`"email":"alice@example.com"}`)
	decoys := b.String()
	for _, body := range []string{plain, decoys} {
		if got, ok := jsonAccount(body, "email"); !ok || got != "alice@example.com" {
			t.Fatalf("jsonAccount = %q, %v", got, ok)
		}
	}
	base := testing.AllocsPerRun(20, func() { jsonAccount(plain, "email") })
	if got := testing.AllocsPerRun(20, func() { jsonAccount(decoys, "email") }); got > base {
		t.Errorf("%v allocations with 1000 escaped decoy keys, %v without", got, base)
	}
}
