package authz_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkgrpc"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
)

// equivalenceConfig has a bucket of every key kind, failure counting,
// costs of every source, shadow and deny policies, so that any
// difference in what the two paths read shows in a decision.
const equivalenceConfig = `
keys:
  tenant_header: x-tenant-id
  account_header: x-login-account
  account_body_field: email
  trusted_hops: 1
  use_external_address_header: true
buckets:
  tenant: {limit: 3, per: 1s, key: tenant, on_missing_key: deny}
  chan: {limit: 3, per: 1s, key: "path:channel"}
  ip: {limit: 3, per: 1s, key: ip}
  login_ip: {limit: 2, per: 1m, key: ip, count: failures}
  login_account: {limit: 2, per: 1m, key: account, count: failures}
  api_key: {limit: 3, per: 1s, key: "header:x-api-key", mode: shadow}
  declared: {limit: 10, per: 1s, key: tenant, cost: {request_header: x-cost, max: 6}}
  bytes: {limit: 100, per: 1s, key: tenant, cost: {content_length: true, max: 60, missing: 7}}
  tokens: {limit: 10, per: 1s, key: tenant, cost: {response_header: x-tokens}}
  weighted: {limit: 10, per: 1s, key: tenant}
routes:
  - {method: POST, path: /api/activities, buckets: [tenant]}
  - {path: /llm, buckets: [bytes, declared, tokens]}
  - {path: /heavy, buckets: [weighted], costs: {weighted: 4}}
  - {name: inbound, path: "/api/inbound/{channel}", buckets: [chan, api_key]}
  - {path: /api/v1/tokens, buckets: [ip]}
  - {method: POST, path: /admin/login, buckets: [login_ip, login_account]}
`

// FuzzCheckWireEquivalence feeds the same bytes to the generic path
// (proto.Unmarshal, Check) and the lean one (checkwire, CheckWire), each
// on its own Service and counters: both must accept or reject the bytes
// alike and, on the same sequence of requests, answer every one alike.
func FuzzCheckWireEquivalence(f *testing.F) {
	for _, r := range []req{
		{path: "/api/activities", headers: tenant("acme")},
		{path: "/api/activities"},
		{path: "/api/inbound/abc?x=1", headers: map[string]string{"x-api-key": "k", "x-forwarded-for": "203.0.113.9, 10.0.0.1"}},
		{path: "/api/v1/tokens", headers: map[string]string{"x-envoy-external-address": "2001:db8::1"}},
		{path: "/admin/login", headers: map[string]string{"x-login-account": "Alice@Example.com", "content-type": "application/json"}, body: `{"email":"bob@example.com"}`},
		{path: "/admin/login", headers: map[string]string{"content-type": "application/x-www-form-urlencoded", "x-envoy-auth-partial-body": "false"}, body: "email=carol%40example.com"},
		{path: "/anything", ext: map[string]string{checkreq.ExtBuckets: "tenant,ip", checkreq.ExtRoute: "inbound"}},
		{path: "/llm", headers: map[string]string{"x-tenant-id": "acme", "x-cost": "5", "content-length": "30"}},
		{path: "/llm", headers: map[string]string{"x-tenant-id": "acme", "x-cost": "5,1"}},
		{path: "/heavy", headers: tenant("acme")},
	} {
		f.Add(marshalRequest(f, checkRequest(r)))
	}
	f.Add([]byte{0x0a, 0x03, 0x22, 0x01, 0x12}) // truncated inside http
	generic := newHarness(f, equivalenceConfig)
	lean := newHarness(f, equivalenceConfig)
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, in []byte) {
		var m authv3.CheckRequest
		refErr := proto.Unmarshal(in, &m)
		var r checkwire.Request
		err := r.Decode(lean.svc.Decoder(), in)
		if (refErr == nil) != (err == nil) {
			t.Fatalf("proto.Unmarshal: %v; checkwire: %v", refErr, err)
		}
		if err != nil {
			return
		}
		want, _ := generic.svc.Check(ctx, &m)
		got, _ := lean.svc.CheckWire(ctx, &r)
		if !proto.Equal(got.CheckResponse(), want) {
			t.Fatalf("lean path answered\n%v\ngeneric path\n%v", got.CheckResponse(), want)
		}
	})
}

// The decisions of the conformance cases are identical through both paths
// (the harness alternates them on every test; this compares answers
// directly, on twin Services).
func TestCheckWireAnswersAsCheck(t *testing.T) {
	generic := newHarness(t, equivalenceConfig)
	lean := newHarness(t, equivalenceConfig)
	codec := checkgrpc.NewCodec()
	ctx := context.Background()
	for i := 0; i < 4; i++ { // past every limit: allowed, then denied
		for _, r := range []req{
			{path: "/api/activities", headers: tenant("acme")},
			{path: "/api/activities"},
			{path: "/api/inbound/abc", headers: map[string]string{"x-api-key": "k"}},
			{path: "/api/v1/tokens", headers: map[string]string{"x-forwarded-for": "203.0.113.9, 10.0.0.1"}},
			{path: "/admin/login", headers: map[string]string{"x-login-account": "alice@example.com"}},
			{path: "/" + strings.Repeat("x", 9000)},
			{path: "/nothing"},
			{path: "/llm", headers: map[string]string{"x-tenant-id": "acme", "x-cost": "3", "content-length": "20"}},
			{path: "/llm", headers: map[string]string{"x-tenant-id": "acme", "x-cost": "-3"}},
			{path: "/heavy", headers: tenant("acme")},
		} {
			wire := marshalRequest(t, checkRequest(r))
			var m authv3.CheckRequest
			if err := proto.Unmarshal(wire, &m); err != nil {
				t.Fatal(err)
			}
			var cr checkwire.Request
			if err := cr.Decode(lean.svc.Decoder(), wire); err != nil {
				t.Fatal(err)
			}
			want, _ := generic.svc.Check(ctx, &m)
			got, _ := lean.svc.CheckWire(ctx, &cr)
			if !proto.Equal(got.CheckResponse(), want) {
				t.Fatalf("%s, round %d: lean %v, generic %v", r.path, i, got.CheckResponse(), want)
			}
			// The codec's encoding is the deterministic marshaller's.
			enc, err := codec.Marshal(got.CheckResponse())
			if err != nil {
				t.Fatal(err)
			}
			ref, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(enc.Materialize(), ref) {
				t.Fatalf("%s, round %d: encoded %x, proto.Marshal %x", r.path, i, enc.Materialize(), ref)
			}
		}
	}
}

// A request decoded before a reload is decided under the new
// configuration with what that one reads: CheckWire decodes it again.
func TestCheckWireAfterReload(t *testing.T) {
	h := newHarness(t, `
buckets:
  by_tenant: {limit: 1, per: 1m, key: tenant}
routes:
  - {path: /x, buckets: [by_tenant]}`)
	wire := marshalRequest(t, checkRequest(req{path: "/x", headers: map[string]string{"x-api-key": "k1", "x-tenant-id": "t"}}))
	var r checkwire.Request
	if err := r.Decode(h.svc.Decoder(), wire); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Request().Headers.Get("x-api-key"); ok {
		t.Fatal("the first configuration does not read x-api-key, yet it was kept")
	}

	h.reload(`
buckets:
  by_key: {limit: 1, per: 1m, key: "header:x-api-key", on_missing_key: deny}
routes:
  - {path: /x, buckets: [by_key]}`)
	// Decoded without x-api-key, the request would be refused for
	// lacking its key (403); read again, it is allowed, then limited.
	ctx := context.Background()
	for i, want := range []bool{true, false} {
		if i > 0 {
			if err := r.Decode(h.svc.Decoder(), wire); err != nil {
				t.Fatal(err)
			}
		}
		got, err := h.svc.CheckWire(ctx, &r)
		if err != nil {
			t.Fatal(err)
		}
		if allowed(got.CheckResponse()) != want {
			t.Fatalf("check %d after the reload: %v", i+1, got.CheckResponse())
		}
		if resp := got.CheckResponse(); !want && resp.GetDeniedResponse().GetStatus().GetCode() != 429 {
			t.Fatalf("denied with %v, want 429", resp)
		}
	}
	if v, _ := r.Request().Headers.Get("x-api-key"); v != "k1" {
		t.Fatalf("x-api-key = %q after the reload", v)
	}
}
