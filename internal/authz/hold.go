package authz

import (
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
)

// hold is what an admitted check reserved (a checkwire.Hold): its leases
// and the costs it took, given back if Envoy never takes the answer.
// Holds are pooled: a check that reserves nothing makes none.
type hold struct {
	s *Service
	r checkwire.Reserved[heldItem]
}

// heldItem is one reservation; its key and request id are in r.Strs.
type heldItem struct {
	t       taken // key and requestID empty
	key, id int
}

// hold returns the reservations among hits as a Hold, nil when none.
func (s *Service) hold(hits []taken) checkwire.Hold {
	var h *hold
	for _, t := range hits {
		if !t.reserved() {
			continue
		}
		if h == nil {
			h = s.holds.Get().(*hold)
		}
		it := heldItem{t: t, key: h.r.Strs.Add(t.key), id: -1}
		if t.lease {
			it.id = h.r.Strs.Add(t.requestID)
		}
		it.t.key, it.t.requestID = "", ""
		h.r.Items = append(h.r.Items, it)
	}
	if h == nil {
		return nil // a typed nil would not compare equal to nil
	}
	return h
}

// Cancel gives every reservation back and counts it.
func (h *hold) Cancel() {
	for _, it := range h.r.Items {
		t := it.t
		t.key = h.r.Strs.Get(it.key)
		if it.id >= 0 {
			t.requestID = h.r.Strs.Get(it.id)
		}
		h.s.giveBack([]taken{t})
		t.b.metrics.cancelled.Inc()
	}
	h.Keep()
}

// Keep drops the hold, its reservations in place.
func (h *hold) Keep() {
	if h.r.Reset() {
		h.s.holds.Put(h)
	}
}
