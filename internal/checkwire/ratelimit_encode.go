package checkwire

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
)

// The hand encoder of the RateLimitResponses the rate limit service
// builds: the overall code, the statuses (code, current limit, remaining,
// reset) and response headers. It writes what
// proto.MarshalOptions{Deterministic: true} writes (the tests compare the
// bytes), without reflection or allocation beyond growing the buffer. A
// message setting anything else (unknown fields, request headers, a raw
// body, dynamic metadata, quotas, a header's raw value, a nil element, a
// string that is not valid UTF-8) takes the standard marshaller.

// Field numbers of RateLimitResponse and what it holds (all below 16:
// one-byte tags).
const (
	fRLOverallCode = 1
	fRLStatuses    = 2
	fRLHeaders     = 3

	fDSCode      = 1
	fDSLimit     = 2
	fDSRemaining = 3
	fDSReset     = 4

	fLimitRPU        = 1
	fLimitUnit       = 2
	fLimitName       = 3
	fLimitMultiplier = 4

	fDurationSeconds = 1
	fDurationNanos   = 2
	fWrapperValue    = 1
)

// AppendRateLimitResponse appends m as one uncompressed gRPC message: the
// 5-byte prefix, then m as the deterministic marshaller writes it.
func AppendRateLimitResponse(b []byte, m *rlsv3.RateLimitResponse) ([]byte, error) {
	at := len(b)
	b = append(b, 0, 0, 0, 0, 0)
	if rateLimitEncodable(m) {
		b = appendRateLimitResponse(b, m)
	} else {
		var err error
		if b, err = (proto.MarshalOptions{Deterministic: true}).MarshalAppend(b, m); err != nil {
			return b[:at], fmt.Errorf("checkwire: encode a RateLimitResponse: %w", err)
		}
	}
	binary.BigEndian.PutUint32(b[at+1:], uint32(len(b)-at-5))
	return b, nil
}

func rateLimitEncodable(m *rlsv3.RateLimitResponse) bool {
	if m == nil || unknown(m) || len(m.RequestHeadersToAdd) > 0 || len(m.RawBody) > 0 || m.DynamicMetadata != nil || m.Quota != nil {
		return false
	}
	for _, s := range m.Statuses {
		if s == nil || unknown(s) || s.Quota != nil || (s.DurationUntilReset != nil && unknown(s.DurationUntilReset)) {
			return false
		}
		if l := s.CurrentLimit; l != nil && (unknown(l) || !utf8.ValidString(l.Name) || (l.UnitMultiplier != nil && unknown(l.UnitMultiplier))) {
			return false
		}
	}
	for _, h := range m.ResponseHeadersToAdd {
		if !headerEncodable(h) {
			return false
		}
	}
	return true
}

func headerEncodable(h *corev3.HeaderValue) bool {
	return h != nil && !unknown(h) && len(h.RawValue) == 0 && utf8.ValidString(h.Key) && utf8.ValidString(h.Value)
}

func appendRateLimitResponse(b []byte, m *rlsv3.RateLimitResponse) []byte {
	// enums are int32: sign-extended on the wire, as the runtime writes them.
	b = appendVarintField(b, fRLOverallCode, uint64(int64(m.OverallCode)))
	for _, s := range m.Statuses {
		b = appendMsgHeader(b, fRLStatuses, sizeDescriptorStatus(s))
		b = appendVarintField(b, fDSCode, uint64(int64(s.Code)))
		if l := s.CurrentLimit; l != nil {
			b = appendMsgHeader(b, fDSLimit, sizeRateLimit(l))
			b = appendVarintField(b, fLimitRPU, uint64(l.RequestsPerUnit))
			b = appendVarintField(b, fLimitUnit, uint64(int64(l.Unit)))
			b = appendString(b, fLimitName, l.Name)
			if u := l.UnitMultiplier; u != nil {
				b = appendMsgHeader(b, fLimitMultiplier, sizeVarintField(uint64(u.Value)))
				b = appendVarintField(b, fWrapperValue, uint64(u.Value))
			}
		}
		b = appendVarintField(b, fDSRemaining, uint64(s.LimitRemaining))
		if d := s.DurationUntilReset; d != nil {
			b = appendMsgHeader(b, fDSReset, sizeVarintField(uint64(d.Seconds))+sizeVarintField(uint64(int64(d.Nanos))))
			b = appendVarintField(b, fDurationSeconds, uint64(d.Seconds))
			b = appendVarintField(b, fDurationNanos, uint64(int64(d.Nanos)))
		}
	}
	for _, h := range m.ResponseHeadersToAdd {
		b = appendMsgHeader(b, fRLHeaders, sizeString(h.Key)+sizeString(h.Value))
		b = appendString(b, fHeaderKey, h.Key)
		b = appendString(b, fHeaderValue, h.Value)
	}
	return b
}

func sizeDescriptorStatus(s *rlsv3.RateLimitResponse_DescriptorStatus) int {
	n := sizeVarintField(uint64(int64(s.Code))) + sizeVarintField(uint64(s.LimitRemaining))
	if l := s.CurrentLimit; l != nil {
		n += 1 + sizeMsg(sizeRateLimit(l))
	}
	if d := s.DurationUntilReset; d != nil {
		n += 1 + sizeMsg(sizeVarintField(uint64(d.Seconds))+sizeVarintField(uint64(int64(d.Nanos))))
	}
	return n
}

func sizeRateLimit(l *rlsv3.RateLimitResponse_RateLimit) int {
	n := sizeVarintField(uint64(l.RequestsPerUnit)) + sizeVarintField(uint64(int64(l.Unit))) + sizeString(l.Name)
	if u := l.UnitMultiplier; u != nil {
		n += 1 + sizeMsg(sizeVarintField(uint64(u.Value)))
	}
	return n
}
