package rls_test

import (
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimit-authz/ratelimit-authz/internal/rls"
)

// FuzzShouldRateLimit decodes random RateLimitRequests, as the gRPC server
// would, and checks what a caller relies on: no panic, no error but
// InvalidArgument, one status per descriptor, codes OK or OVER_LIMIT, and
// an overall code that follows the statuses. pick, when it indexes the
// configured domains, replaces the request's domain, so that mutations
// explore the rules and not only unknown domains.
func FuzzShouldRateLimit(f *testing.F) {
	h := newHarness(f, rls.Settings{ResponseHeaders: true}, "service.yaml", "replaces.yaml", "share_threshold.yaml", "another.yaml", inflightYAML)
	domains := h.cfg.Domains()
	seed := func(pick uint8, req *rlsv3.RateLimitRequest) {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(pick, b)
	}
	none := uint8(255)
	seed(none, &rlsv3.RateLimitRequest{})
	seed(none, &rlsv3.RateLimitRequest{Domain: "service", Descriptors: ds(desc("hello", "world"))})
	seed(none, &rlsv3.RateLimitRequest{Domain: "replaces", HitsAddend: 3, Descriptors: ds(desc("key_1", "value_1", "user", "u"), desc("key_2", "value_2", "user", "u"), desc("key_3", "x"))})
	seed(none, &rlsv3.RateLimitRequest{Domain: "share-threshold", Descriptors: ds(desc("files", "files/a.pdf"), desc("files_no_share", "files_no_share/b"))})
	seed(0, &rlsv3.RateLimitRequest{Domain: "x", Descriptors: ds(withLimit(desc("k", "v"), 5, 4), withHits(desc("key2", "v"), 0), withLimit(desc("hello", "world"), 0, 7))})
	seed(1, &rlsv3.RateLimitRequest{Descriptors: ds(withHits(desc("key_1", "value_1", "user", "u"), 1<<40), desc())})
	seed(2, &rlsv3.RateLimitRequest{Descriptors: ds(desc("tenant", "acme", "route", "r"), desc("unlimited", "u"), desc("blocked", "b"), desc("sliding", "s"), desc("week", "w"))})
	seed(3, &rlsv3.RateLimitRequest{Descriptors: ds(desc("files", strings.Repeat("f", 300)))})
	seed(none, &rlsv3.RateLimitRequest{Domain: "service", HitsAddend: 1 << 31, Descriptors: ds(withHits(desc("tokens", "a"), 1<<40), negative(withHits(desc("tokens", "a"), 5)),
		withHits(desc("tokens_sliding", "b"), 0), desc("tokens_shadow", "c"), negative(desc("hello", "world")))})
	seed(none, &rlsv3.RateLimitRequest{Domain: "inflight", Descriptors: ds(acquire("acme", "r1"), acquire("acme", "r1"), release("acme", "r1"), release("acme", "r2"),
		desc("tenant", "acme", "request_id", ""), desc("tenant", "acme", "request_id", strings.Repeat("i", 200)), negative(desc("shadow", "s", "request_id", "s1")))})

	f.Fuzz(func(t *testing.T, pick uint8, raw []byte) {
		req := &rlsv3.RateLimitRequest{}
		if proto.Unmarshal(raw, req) != nil {
			return
		}
		if int(pick) < len(domains) {
			req.Domain = domains[pick]
		}
		resp, err := h.shouldOn(t, req)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument || resp != nil {
				t.Fatalf("%v, %v: only InvalidArgument, without a response, may fail a call", resp, err)
			}
			return
		}
		if len(resp.GetStatuses()) != len(req.GetDescriptors()) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(req.GetDescriptors()))
		}
		over := false
		for i, s := range resp.GetStatuses() {
			switch s.GetCode() {
			case rlsv3.RateLimitResponse_OVER_LIMIT:
				over = true
				if s.GetCurrentLimit() == nil || s.GetLimitRemaining() != 0 {
					t.Fatalf("status %d over the limit without its limit, or with %d remaining", i, s.GetLimitRemaining())
				}
			case rlsv3.RateLimitResponse_OK:
			default:
				t.Fatalf("status %d has code %v", i, s.GetCode())
			}
			if s.GetCurrentLimit() != nil && s.GetDurationUntilReset().GetSeconds() < 1 {
				t.Fatalf("status %d: duration_until_reset %v, want ≥ 1 s", i, s.GetDurationUntilReset())
			}
		}
		if want := map[bool]rlsv3.RateLimitResponse_Code{false: rlsv3.RateLimitResponse_OK, true: rlsv3.RateLimitResponse_OVER_LIMIT}[over]; resp.GetOverallCode() != want {
			t.Fatalf("overall %v with a status over: %v", resp.GetOverallCode(), over)
		}
		if _, err := proto.Marshal(resp); err != nil {
			t.Fatalf("the response does not marshal: %v", err)
		}
	})
}
