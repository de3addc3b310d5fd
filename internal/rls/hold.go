package rls

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

// leaseHold is the leases one call acquired (a checkwire.Hold), released
// if Envoy never takes the answer. Rate hits are not held: as upstream,
// a request that reached the service counts whatever its answer.
type leaseHold struct {
	s *Service
	r checkwire.Reserved[heldLease]
}

// heldLease is one lease; its key and request id are in r.Strs.
type heldLease struct {
	bucket    counter.Bucket
	key, id   int
	cancelled prometheus.Counter
}

func (h *leaseHold) add(rs *ruleState, key, requestID string) {
	h.r.Items = append(h.r.Items, heldLease{bucket: rs.id, key: h.r.Strs.Add(key), id: h.r.Strs.Add(requestID), cancelled: rs.m[decCancelled]})
}

// Cancel releases every lease and counts it.
func (h *leaseHold) Cancel() {
	for _, l := range h.r.Items {
		h.s.opts.Leases.Release(l.bucket, h.r.Strs.Get(l.key), h.r.Strs.Get(l.id))
		l.cancelled.Inc()
	}
	h.Keep()
}

// Keep drops the hold, its leases held.
func (h *leaseHold) Keep() {
	if h.r.Reset() {
		h.s.holds.Put(h)
	}
}
