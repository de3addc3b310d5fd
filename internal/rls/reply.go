package rls

import (
	"strconv"
	"unsafe"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
)

// inlineStatuses statuses fit in a reply's one allocation; more take two
// more.
const inlineStatuses = 3

// slot holds what one counted descriptor's status points to.
type slot struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	reset  durationpb.Duration
	lim    rlsv3.RateLimitResponse_RateLimit // a current_limit the configuration does not hold
}

// reply is a response in one allocation for up to inlineStatuses
// descriptors. The lean path reuses one from call to call (reset, release).
type reply struct {
	resp   rlsv3.RateLimitResponse
	ptrs   [inlineStatuses]*rlsv3.RateLimitResponse_DescriptorStatus
	inline [inlineStatuses]slot
	slots  []slot
	hptrs  [3]*corev3.HeaderValue
	hdrs   [3]corev3.HeaderValue
	hvals  [3 * 20]byte // the header values' bytes

	// Room for more than inlineStatuses, kept by a reused reply.
	morePtrs []*rlsv3.RateLimitResponse_DescriptorStatus
	more     []slot

	// held are the leases the call acquired; nil: none.
	held *leaseHold
}

// maxPooledStatuses bounds the room a pooled reply keeps.
const maxPooledStatuses = DefaultMaxDescriptors

// reset makes r an empty response of n statuses.
func (r *reply) reset(n int) {
	r.resp.OverallCode, r.resp.ResponseHeadersToAdd, r.held = 0, nil, nil
	if n <= inlineStatuses {
		r.resp.Statuses = r.ptrs[:n]
		r.slots = r.inline[:n]
	} else {
		if cap(r.more) < n {
			r.more = make([]slot, n)
			r.morePtrs = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
		}
		r.resp.Statuses = r.morePtrs[:n]
		r.slots = r.more[:n]
	}
	for i := range r.slots {
		r.slots[i] = slot{} // an override's unit_multiplier must not outlive its call
	}
}

// release drops what r points to (the configuration's limits, a
// request's strings) and reports whether r is worth keeping for reuse.
func (r *reply) release() bool {
	clear(r.ptrs[:])
	for i := range r.slots {
		r.slots[i] = slot{}
	}
	clear(r.morePtrs)
	for i := range r.hdrs {
		r.hdrs[i] = corev3.HeaderValue{}
	}
	r.resp.Statuses, r.resp.ResponseHeadersToAdd, r.slots, r.held = nil, nil, nil, nil
	return cap(r.more) <= maxPooledStatuses
}

// hold is what the call acquired, as the transport ends it.
func (r *reply) hold() checkwire.Hold {
	if r.held == nil {
		return nil // a typed nil would not compare equal to nil
	}
	return r.held
}

func (r *reply) slot(i int) *slot { return &r.slots[i] }

func (sl *slot) set(c rlsv3.RateLimitResponse_Code, current *rlsv3.RateLimitResponse_RateLimit, remaining uint32, resetS int64) *rlsv3.RateLimitResponse_DescriptorStatus {
	sl.reset.Seconds = resetS
	sl.status.Code = c
	sl.status.CurrentLimit = current
	sl.status.LimitRemaining = remaining
	sl.status.DurationUntilReset = &sl.reset
	return &sl.status
}

// override is the current_limit of a tenant override: its limit, in the
// unit of its window (tenant overrides have whole-unit windows; another
// is reported in seconds with unit_multiplier).
func (sl *slot) override(name string, l counter.Limit) *rlsv3.RateLimitResponse_RateLimit {
	sl.lim.Name = name
	sl.lim.RequestsPerUnit = uint32(l.Limit) // ≤ counter.MaxLimit
	sl.lim.Unit = rlsv3.RateLimitResponse_RateLimit_SECOND
	for _, u := range []rlsconfig.Unit{rlsconfig.Second, rlsconfig.Minute, rlsconfig.Hour, rlsconfig.Day, rlsconfig.Week} {
		if u.Seconds()*1000 == l.ScaleMS {
			sl.lim.Unit = rlsv3.RateLimitResponse_RateLimit_Unit(u)
			return &sl.lim
		}
	}
	sl.lim.UnitMultiplier = wrapperspb.UInt32(uint32(seconds(l.ScaleMS)))
	return &sl.lim
}

// addHeaders adds upstream's three response headers for the descriptor
// upstream picks: the last one over its limit, else the limited one with
// the least remaining, the first of equals. None when no status has a
// limit.
func (r *reply) addHeaders(set *Settings) {
	var pick *rlsv3.RateLimitResponse_DescriptorStatus
	for _, ds := range r.resp.Statuses {
		switch {
		case ds.Code == rlsv3.RateLimitResponse_OVER_LIMIT:
			pick = ds
		case ds.CurrentLimit != nil && (pick == nil || ds.LimitRemaining < pick.LimitRemaining):
			pick = ds
		}
	}
	if pick == nil || pick.CurrentLimit == nil {
		return
	}
	// The three values in r's own bytes, viewed: the strings live as
	// long as r, and are rewritten only by r's next reset.
	out := strconv.AppendUint(r.hvals[:0], uint64(pick.CurrentLimit.RequestsPerUnit), 10)
	i1 := len(out)
	out = strconv.AppendUint(out, uint64(pick.LimitRemaining), 10)
	i2 := len(out)
	out = strconv.AppendInt(out, pick.DurationUntilReset.GetSeconds(), 10)
	all := keyString(out)
	r.hdrs[0].Key, r.hdrs[0].Value = set.LimitHeader, all[:i1]
	r.hdrs[1].Key, r.hdrs[1].Value = set.RemainingHeader, all[i1:i2]
	r.hdrs[2].Key, r.hdrs[2].Value = set.ResetHeader, all[i2:]
	for i := range r.hdrs {
		r.hptrs[i] = &r.hdrs[i]
	}
	r.resp.ResponseHeadersToAdd = r.hptrs[:]
}

// keyString views key as a string without copying it, for the counter,
// which keeps copies of the keys it stores and nothing else (see Limiter):
// the buffer is reused by the next call.
func keyString(key []byte) string {
	return unsafe.String(unsafe.SliceData(key), len(key))
}
