package replicate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// Cluster queries: a node asks every peer one question on
// <prefix>.query, and each peer that has an answerer (SetAnswerer) answers
// on the asker's inbox. Both are messages of the wire format (kinds query
// and answer), sealed like batches when a cluster key is set, so a
// captured answer opens as nothing else and only the cluster's nodes can
// read one; a peer answers at most queryAnswersPerSecond queries, on an
// inbox subject only. The asker waits for the peers it heard from lately,
// at most until its context ends, and names those that did not answer.

// queryAnswersPerSecond bounds the queries a node answers.
const queryAnswersPerSecond = 10

// Answerer answers a query's body; it must be safe for concurrent use and
// quick (it runs on NATS's delivery goroutine).
type Answerer func(query []byte) []byte

// Answer is one peer's answer to a query.
type Answer struct {
	Node        string
	Incarnation uint64
	Body        []byte
}

// querier answers peers' queries; its state is owned by the query
// subscription's handler (one message at a time).
type querier struct {
	rx      message
	buf     rxBuffers
	answers tokenBucket
	probes  tokenBucket // echoes of link probes (probe.go)
	sealBuf []byte
	sealAD  []byte
}

// SetAnswerer makes this node answer peers' queries with a; nil stops
// answering. Safe for concurrent use.
func (r *Replicator) SetAnswerer(a Answerer) {
	if a == nil {
		r.answerer.Store(nil)
		return
	}
	r.answerer.Store(&a)
}

// onQuery answers a peer's query, when an answerer is set, and echoes
// its link probes (probe.go) at once.
func (r *Replicator) onQuery(nc *nats.Conn, msg *nats.Msg) {
	q := &r.query
	now := r.now()
	if !r.read(msg.Data, &q.rx, kindQuery, &q.buf, now) || !validReply(msg.Reply) {
		return
	}
	m := message{header: header{Kind: kindAnswer, Node: r.self.Node, Incarnation: r.self.Incarnation, SentAtMS: now.UnixMilli()}}
	if isProbe(q.rx.Body) {
		if !q.probes.allow(now) {
			return
		}
		m.Body = q.rx.Body
	} else {
		a := r.answerer.Load()
		if a == nil || !q.answers.allow(now) {
			return
		}
		m.Body = string((*a)([]byte(q.rx.Body)))
	}
	data := r.sealed(&q.sealBuf, &q.sealAD, m.encode(nil), kindAnswer)
	if len(data) > r.maxOut(nc) {
		r.log.Warn("a query's answer is too large to send", "bytes", len(data), "peer", q.rx.origin().String())
		return
	}
	if err := r.hooks.send(nc, msg.Reply, data); err != nil {
		r.m.publishErrors.Inc()
		r.log.Warn("answer a query", "peer", q.rx.origin().String(), "err", err)
	}
}

// Ask sends query to every peer and returns the answers that came before
// every peer heard from lately had answered or ctx ended, and every peer
// of the peer table that did not answer: one gone silent (killed, cut
// off) stays named until Config.PeerExpiry passes, as long as
// replicate_peers counts it, or its node is heard under a newer
// incarnation (restarted); Ask does not wait for it.
// It fails when this node is not connected to NATS or the query does not
// fit in a message.
func (r *Replicator) Ask(ctx context.Context, query []byte) (answers []Answer, missing []PeerInfo, err error) {
	nc := r.conn.Load()
	if nc == nil || !r.connected() {
		return nil, nil, errors.New("replicate: ask: not connected to NATS")
	}
	now := r.now()
	expected := r.peers.live(nil, now.Add(-shareLive*r.cfg.Heartbeat))
	known := r.peers.live(nil, time.Time{})
	m := message{header: header{Kind: kindQuery, Node: r.self.Node, Incarnation: r.self.Incarnation, SentAtMS: now.UnixMilli()}, Body: string(query)}
	var sealBuf, sealAD []byte
	data := r.sealed(&sealBuf, &sealAD, m.encode(nil), kindQuery)
	if len(data) > r.maxOut(nc) {
		return nil, nil, fmt.Errorf("replicate: ask: a query of %d bytes does not fit in a message", len(data))
	}
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, nil, fmt.Errorf("replicate: ask: subscribe to the inbox: %w", err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishMsg(&nats.Msg{Subject: r.querySubj, Reply: inbox, Data: data}); err != nil {
		return nil, nil, fmt.Errorf("replicate: ask: publish: %w", err)
	}
	heard := map[origin]bool{}
	var rx message
	var buf rxBuffers
	for len(heard) < len(expected) && len(heard) < r.cfg.MaxPeers {
		msg, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			break // ctx ended (or the connection closed): the rest are missing
		}
		if !r.read(msg.Data, &rx, kindAnswer, &buf, r.now()) || heard[rx.origin()] {
			continue
		}
		heard[rx.origin()] = true
		answers = append(answers, Answer{Node: rx.Node, Incarnation: rx.Incarnation, Body: []byte(rx.Body)})
	}
	// A node restarted left its old incarnation: heard later under a new
	// one, the old is not missing.
	latest := map[string]time.Time{}
	for _, p := range known {
		if p.last.After(latest[p.id.Node]) {
			latest[p.id.Node] = p.last
		}
	}
	for _, p := range known {
		if !heard[p.id] && !latest[p.id.Node].After(p.last) {
			missing = append(missing, PeerInfo{Node: p.id.Node, Incarnation: p.id.Incarnation, LastHeard: p.last})
		}
	}
	return answers, missing, nil
}
