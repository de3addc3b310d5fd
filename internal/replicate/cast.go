package replicate

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/wirecode"
)

// Casts: another component of the node (the in-flight gauges and
// releases of package inflight) broadcasts opaque bodies to every peer on
// <prefix>.cast. A cast is a message of the wire format (kind cast),
// sealed like batches when a cluster key is set, read and checked like
// every message (size, seal, decoding, sender, clock skew), from a peer
// the peer table admits; each sender numbers its casts, and a cast whose
// number is not above the last one delivered from its sender (a replayed
// or reordered message) is dropped and counted. What the body means, and
// its validation, belong to the component.

// CastHandler receives a peer's cast: the peer, under the id the peer
// table gives it (never reused for another process), and the body. It
// runs on NATS's delivery goroutine, one cast at a time, and must be
// quick; body is its own to keep.
type CastHandler func(from counter.PeerID, body []byte)

// caster is the cast subscription's state, owned by its handler.
type caster struct {
	rx  message
	buf rxBuffers
}

// SetCastHandler makes h receive the peers' casts; nil drops them. Safe
// for concurrent use.
func (r *Replicator) SetCastHandler(h CastHandler) {
	if h == nil {
		r.castHandler.Store(nil)
		return
	}
	r.castHandler.Store(&h)
}

// MaxCast is the largest body Cast sends.
func (r *Replicator) MaxCast() int {
	n := r.cfg.MaxMessageBytes - sealOverhead
	if nc := r.conn.Load(); nc != nil {
		n = r.maxOut(nc)
	}
	// The header: magic, version, kind, node, incarnation, sent_at, seq,
	// the body's length.
	return n - (4 + wirecode.UvarintLen(uint64(len(r.self.Node))) + len(r.self.Node) + 8 + 10 + 10 + 10)
}

// Cast sends body to every peer. It fails when this node is not
// connected to NATS or body is larger than MaxCast. Safe for concurrent
// use.
func (r *Replicator) Cast(body []byte) error {
	nc := r.conn.Load()
	if nc == nil || !r.connected() {
		return errors.New("replicate: cast: not connected to NATS")
	}
	if len(body) > r.MaxCast() {
		return fmt.Errorf("replicate: cast: a body of %d bytes is larger than %d", len(body), r.MaxCast())
	}
	m := message{header: header{Kind: kindCast, Node: r.self.Node, Incarnation: r.self.Incarnation,
		SentAtMS: r.now().UnixMilli(), Seq: r.castSeq.Add(1)}, Body: string(body)}
	var sealBuf, sealAD []byte
	data := r.sealed(&sealBuf, &sealAD, m.encode(nil), kindCast)
	if err := r.hooks.send(nc, r.castSubj, data); err != nil {
		r.m.publishErrors.Inc()
		return fmt.Errorf("replicate: cast: publish: %w", err)
	}
	return nil
}

// onCast hands a peer's cast to the handler.
func (r *Replicator) onCast(msg *nats.Msg) {
	h := r.castHandler.Load()
	if h == nil {
		return
	}
	c := &r.cast
	now := r.now()
	if !r.read(msg.Data, &c.rx, kindCast, &c.buf, now) {
		return
	}
	p := r.peers.get(c.rx.Node, c.rx.Incarnation, now, true)
	if p == nil {
		r.m.peersRefused.Inc()
		return
	}
	if p.haveCastSeq && c.rx.Seq <= p.castSeq {
		r.m.malformed.replayed.Inc()
		return
	}
	p.castSeq, p.haveCastSeq = c.rx.Seq, true
	(*h)(p.id, []byte(c.rx.Body))
}
