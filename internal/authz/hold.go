package authz

import (
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
)

// hold is what an admitted check reserved (a checkwire.Hold): its leases
// and the costs it took, given back if Envoy never takes the answer.
// Holds are pooled: a check that reserves nothing makes none.
type hold struct {
	s     *Service
	items []heldItem
	strs  checkwire.Copies
}

// heldItem is one reservation; its key and request id are in strs.
type heldItem struct {
	t       taken // key and requestID empty
	key, id int
}

// maxPooledHoldBytes: a hold whose copies grew past this (a request with
// huge keys) is left to the garbage collector rather than pooled.
const maxPooledHoldBytes = 4 << 10

// hold returns the reservations among hits as a Hold, nil when none.
func (s *Service) hold(hits []taken) checkwire.Hold {
	var h *hold
	for i := range hits {
		t := hits[i]
		if !t.reserved() {
			continue
		}
		if h == nil {
			h = s.holds.Get().(*hold)
		}
		it := heldItem{t: t, key: h.strs.Add(t.key), id: -1}
		if t.lease {
			it.id = h.strs.Add(t.requestID)
		}
		it.t.key, it.t.requestID = "", ""
		h.items = append(h.items, it)
	}
	if h == nil {
		return nil // a typed nil would not compare equal to nil
	}
	return h
}

// Cancel gives every reservation back and counts it.
func (h *hold) Cancel() {
	for _, it := range h.items {
		t := it.t
		t.key = h.strs.Get(it.key)
		if it.id >= 0 {
			t.requestID = h.strs.Get(it.id)
		}
		h.s.giveBack([]taken{t})
		t.b.metrics.cancelled.Inc()
	}
	h.Keep()
}

// Keep drops the hold, its reservations in place.
func (h *hold) Keep() {
	clear(h.items)
	h.items = h.items[:0]
	h.strs.Reset()
	if h.strs.Cap() <= maxPooledHoldBytes {
		h.s.holds.Put(h)
	}
}
