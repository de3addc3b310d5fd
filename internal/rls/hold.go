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
	s      *Service
	leases []heldLease
	strs   checkwire.Copies
}

// heldLease is one lease; its key and request id are in strs.
type heldLease struct {
	bucket    counter.Bucket
	key, id   int
	cancelled prometheus.Counter
}

// maxPooledHoldBytes: a hold whose copies grew past this is left to the
// garbage collector rather than pooled.
const maxPooledHoldBytes = 4 << 10

func (h *leaseHold) add(rs *ruleState, key, requestID string) {
	h.leases = append(h.leases, heldLease{bucket: rs.id, key: h.strs.Add(key), id: h.strs.Add(requestID), cancelled: rs.m[decCancelled]})
}

// Cancel releases every lease and counts it.
func (h *leaseHold) Cancel() {
	for _, l := range h.leases {
		h.s.opts.Leases.Release(l.bucket, h.strs.Get(l.key), h.strs.Get(l.id))
		l.cancelled.Inc()
	}
	h.Keep()
}

// Keep drops the hold, its leases held.
func (h *leaseHold) Keep() {
	clear(h.leases)
	h.leases = h.leases[:0]
	h.strs.Reset()
	if h.strs.Cap() <= maxPooledHoldBytes {
		h.s.holds.Put(h)
	}
}
