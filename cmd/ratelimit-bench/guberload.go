package main

import (
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
)

// getRateLimitsMethod is gubernator's rate limit call (pb.gubernator.V1),
// an anchor the bench measures beside ShouldRateLimit.
const getRateLimitsMethod = "/pb.gubernator.V1/GetRateLimits"

// newGuberCaller opens n connections (see dial) to the targets for
// gubernator's GetRateLimits. gubernator has no configuration file: each
// call carries its limits, one RateLimitReq per descriptor the rls load
// would send (rlsRequest), named by the domain and the descriptor's first
// key and keyed by its values, limit hits per per, token bucket, so both
// loads count the same keys. Any OVER_LIMIT is a denial.
func newGuberCaller(targets []string, n, descriptors int, limit int64, per time.Duration) (*grpcCaller, error) {
	if descriptors < 1 || descriptors > maxRLSDescripts {
		return nil, fmt.Errorf("--descriptors %d: must be from 1 to %d", descriptors, maxRLSDescripts)
	}
	if limit < 1 || per < time.Millisecond {
		return nil, fmt.Errorf("--limit %d per %v: the limit must be at least 1 and the window at least 1ms", limit, per)
	}
	conns, err := dial(targets, n, rawCodec{read: guberStatus})
	if err != nil {
		return nil, err
	}
	return &grpcCaller{conns: conns, method: getRateLimitsMethod, what: "GetRateLimitsReq",
		encode: func(r request, _ uint64) ([]byte, error) {
			return guberRequest(r, descriptors, limit, per), nil
		},
		judge: func(over int32) (int, int) {
			if over == 1 {
				return classDenied, int(codes.ResourceExhausted)
			}
			return classAllowed, 0
		}}, nil
}

// guberRequest encodes GetRateLimitsReq by hand (gubernator's module needs
// a newer Go than the server's): requests = 1, each RateLimitReq with
// name = 1, unique_key = 2, hits = 3, limit = 4, duration (ms) = 5.
func guberRequest(r request, descriptors int, limit int64, per time.Duration) []byte {
	rr := rlsRequest(r, descriptors)
	var b []byte
	for _, d := range rr.Descriptors {
		var key []byte
		for i, e := range d.Entries {
			if i > 0 {
				key = append(key, '_')
			}
			key = append(key, e.Value...)
		}
		var m []byte
		m = protowire.AppendTag(m, 1, protowire.BytesType)
		m = protowire.AppendString(m, rr.Domain+"_"+d.Entries[0].Key)
		m = protowire.AppendTag(m, 2, protowire.BytesType)
		m = protowire.AppendBytes(m, key)
		m = protowire.AppendTag(m, 3, protowire.VarintType)
		m = protowire.AppendVarint(m, 1)
		m = protowire.AppendTag(m, 4, protowire.VarintType)
		m = protowire.AppendVarint(m, uint64(limit))
		m = protowire.AppendTag(m, 5, protowire.VarintType)
		m = protowire.AppendVarint(m, uint64(per.Milliseconds()))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, m)
	}
	return b
}

// guberStatus reads GetRateLimitsResp: 1 when any RateLimitResp
// (responses = 1) has status (= 1) OVER_LIMIT (1), an error when one
// carries an error (= 5), else 0.
func guberStatus(b []byte) (int32, error) {
	var over int32
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		if num == 1 && typ == protowire.BytesType {
			resp, _ := protowire.ConsumeBytes(b[:n])
			st, err := codeField(resp)
			if err != nil {
				return 0, err
			}
			e, err := lastField(resp, 5, protowire.BytesType)
			if err != nil {
				return 0, err
			}
			if msg, _ := protowire.ConsumeBytes(e); len(msg) > 0 {
				return 0, fmt.Errorf("gubernator: %s", msg)
			}
			if st == 1 {
				over = 1
			}
		}
		b = b[n:]
	}
	return over, nil
}
