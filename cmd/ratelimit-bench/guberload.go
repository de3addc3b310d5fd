package main

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// guberLoad is gubernator's GetRateLimits (pb.gubernator.V1), an anchor
// the bench measures beside ShouldRateLimit. gubernator has no
// configuration file: each call carries its limits, one RateLimitReq per
// descriptor the rls load would send (rlsRequest), named by the domain
// and the descriptor's first key and keyed by its values, limit hits per
// per, token bucket, so both loads count the same keys. Any OVER_LIMIT is
// a denial.
func guberLoad(descriptors int, limit int64, per time.Duration) (grpcLoad, error) {
	l, err := rlsLoad(descriptors)
	if err != nil {
		return l, err
	}
	if limit < 1 || per < time.Millisecond {
		return l, fmt.Errorf("--limit %d per %v: the limit must be at least 1 and the window at least 1ms", limit, per)
	}
	l.method = "/pb.gubernator.V1/GetRateLimits"
	l.encode = func(r request, _ uint64) ([]byte, error) { return guberRequest(r, descriptors, limit, per), nil }
	l.judge = func(b []byte) (outcome, error) {
		over, err := guberStatus(b)
		return overLimit(over == 1), err
	}
	return l, nil
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
		m := protowire.AppendTag(nil, 1, protowire.BytesType)
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
func guberStatus(b []byte) (over int32, err error) {
	err = eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		resp, _ := protowire.ConsumeBytes(v) // whole: eachField checked it
		st, err := codeField(resp)
		if err != nil {
			return err
		}
		e, err := lastField(resp, 5, protowire.BytesType)
		if msg, _ := protowire.ConsumeBytes(e); err == nil && len(msg) > 0 {
			err = fmt.Errorf("gubernator: %s", msg)
		}
		if st == 1 {
			over = 1
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	return over, nil
}
