package authz

import (
	"context"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/accesslog"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/inflight"
)

// Leases holds the leases of the concurrency buckets (*inflight.Table
// is one): Check acquires one per request and bucket, keyed by the
// request id, and releases it when a later bucket denies the request;
// Envoy's access log releases the others (package accesslog).
type Leases interface {
	Acquire(bucket counter.Bucket, key, requestID string, limit int64, ttl time.Duration, now time.Time) inflight.Result
	Release(bucket counter.Bucket, key, requestID string) bool
}

var _ Leases = (*inflight.Table)(nil)

// RequestIDHeader is the header a concurrency bucket's lease is keyed by:
// Envoy sets it on every request (generating it at the edge) and logs it
// as request.request_id, which releases the lease.
const RequestIDHeader = "x-request-id"

// leaseKey is the key a lease of key is held under, the one the dynamic
// metadata carries back (metadata strings are UTF-8): key itself, or
// with invalid bytes replaced.
func leaseKey(key string) string {
	if utf8.ValidString(key) {
		return key
	}
	return strings.ToValidUTF8(key, "\uFFFD")
}

// concurrencyRetryMS is the Retry-After of a concurrency denial: a slot
// frees when a request in flight ends, which no window predicts; a second
// is the smallest Retry-After.
const concurrencyRetryMS = 1000

// acquire takes a lease of bucket b for the request, or returns the
// denial (nil when the request goes on: acquired, or a shadow bucket's
// denial). acquired reports whether held is a lease taken, to release if
// a later bucket denies.
func (s *Service) acquire(ctx context.Context, b *bucketState, key, requestID string, lim counter.Limit, now time.Time) (v applied, held taken, acquired bool, deny *authv3.CheckResponse) {
	key = leaseKey(key)
	r := s.leases.Acquire(b.id, key, requestID, lim.Limit, b.rule.LeaseTTL, now)
	switch r.Outcome {
	case inflight.Acquired:
		b.metrics.checks[decAllowed].Inc()
		return applied{b, lim, max(0, lim.Limit-r.InFlight), concurrencyRetryMS},
			taken{b: b, key: key, lease: true, requestID: requestID}, true, nil
	case inflight.DeniedRequestID, inflight.DeniedInvalid:
		b.metrics.checks[decMissingKey].Inc()
		if b.rule.Shadow {
			return applied{b, lim, 0, concurrencyRetryMS}, taken{}, false, nil
		}
		return applied{}, taken{}, false, s.denyStatus(b, s.statusBadRequestID, s.http400, "missing_request_id")
	}
	if r.Outcome == inflight.DeniedFull {
		b.metrics.checks[decOverflow].Inc()
	} else {
		b.metrics.exceeded.Inc()
		if b.rule.Shadow {
			b.metrics.checks[decShadowDenied].Inc()
			return applied{b, lim, 0, concurrencyRetryMS}, taken{}, false, nil
		}
		b.metrics.checks[decDenied].Inc()
	}
	res := counter.Result{Count: r.InFlight, RetryAfterMS: concurrencyRetryMS}
	return applied{}, taken{}, false, s.denyLimited(ctx, b, key, lim, res)
}

// appendConcurrencyPolicy appends one RateLimit-Policy item of a
// concurrency bucket: "name";q=5;qu="concurrent-requests".
func appendConcurrencyPolicy(dst []byte, b *bucketState, lim counter.Limit) []byte {
	dst = append(dst, b.quoted...)
	dst = append(dst, ";q="...)
	dst = strconv.AppendInt(dst, lim.Limit, 10)
	return append(dst, `;qu="concurrent-requests"`...)
}

// leaseMeta is the dynamic metadata of the leases a request holds, in
// one allocation (plus its maps) for up to two leases.
type leaseMeta struct {
	outer, leases structpb.Struct
	leasesVal     structpb.Value
	leasesKind    structpb.Value_StructValue
	keys          [2]strValue // most requests hold one lease; more take one allocation each
}

// withLeases adds to md (nil: a new Struct) the leases the request holds,
// under accesslog.MetaLeases: bucket name → key, so that the access-log
// entry of the request releases them.
func withLeases(md *structpb.Struct, hits []taken) *structpb.Struct {
	m := new(leaseMeta)
	m.leases.Fields = make(map[string]*structpb.Value, 1)
	n := 0
	for _, t := range hits {
		if !t.lease {
			continue
		}
		var v *structpb.Value
		if n < len(m.keys) {
			v = m.keys[n].set(t.key)
		} else {
			v = structpb.NewStringValue(t.key)
		}
		m.leases.Fields[t.b.rule.Name] = v
		n++
	}
	if md == nil {
		m.outer.Fields = make(map[string]*structpb.Value, 1)
		md = &m.outer
	}
	m.leasesKind.StructValue = &m.leases
	m.leasesVal.Kind = &m.leasesKind
	md.Fields[accesslog.MetaLeases] = &m.leasesVal
	return md
}

// requestID is the request's id of its leases.
func requestID(in *checkreq.Request) string { return in.Headers.Value(RequestIDHeader) }
