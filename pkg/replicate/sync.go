package replicate

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ratelimit-authz/ratelimit-authz/pkg/counter"
)

// onSyncRequest answers a peer's sync request with every count this node
// holds for live windows, in as many chunks as the message size needs.
func (r *Replicator) onSyncRequest(msg *nats.Msg) {
	var m Message
	if !r.read(msg.Data, &m, KindSyncRequest) {
		return
	}
	if msg.Reply == "" {
		r.m.malformed[malKind].Inc()
		return
	}
	nc := r.conn.Load()
	if nc == nil {
		return
	}
	for _, chunk := range r.syncReply(r.maxOut(nc), r.now(), time.UnixMilli(m.SentAtMS)) {
		if err := r.publish(nc, msg.Reply, chunk); err != nil {
			r.m.publishErrors.Inc()
			r.log.Warn("answer a sync request", "peer", m.Node, "err", err)
			return
		}
	}
	r.m.syncServed.Inc()
	r.log.Debug("answered a sync request", "peer", m.Node)
}

// syncReply returns the chunks of a sync reply to a request sent at asked
// (the requester's clock). A reply built after that instant is reused, if
// it is less than a second old: a burst of requests (every node
// reconnecting at once after a NATS restart) costs one pass over the
// store, and no requester gets counts older than its request.
func (r *Replicator) syncReply(max int, now, asked time.Time) [][]byte {
	r.syncMu.Lock()
	defer r.syncMu.Unlock()
	if r.syncCache != nil && !r.syncAt.Before(asked) && now.Sub(r.syncAt) < syncCacheAt && !now.Before(r.syncAt) {
		return r.syncCache
	}
	r.snap = r.store.Snapshot(r.snap[:0], now)
	var chunks [][]byte
	sp := r.syncSplit
	sp.max = max
	sp.emit = func(b []byte) error {
		chunks = append(chunks, append([]byte(nil), b...))
		return nil
	}
	sp.start(Header{Kind: KindSyncReply, Node: r.self.Node, Incarnation: r.self.Incarnation, SentAtMS: now.UnixMilli()})
	for i := range r.snap {
		pc := &r.snap[i]
		if int(pc.Bucket) >= len(r.cfg.Buckets) {
			continue
		}
		o := r.self
		if pc.Peer != counter.Self {
			var ok bool
			if o, ok = r.peers.identity(pc.Peer); !ok {
				continue // forgotten peer: its counts stay here, but cannot be named
			}
		}
		l := Limit{Name: r.cfg.Buckets[pc.Bucket], ScaleMS: pc.ScaleMS, Algorithm: pc.Algorithm}
		_ = sp.add(l, o, pc.Window, pc.Key, pc.Count) // too large for any message: left out
	}
	_ = sp.flush(true)
	clear(r.snap) // drop the key strings
	r.syncCache, r.syncAt = chunks, now
	return chunks
}

// sync asks the peers for their counts and merges the replies until one
// peer's reply is complete (plus a short grace for the others) or
// WarmStartTimeout has passed. Every complete reply holds the counts of
// every node its sender knows, so one is enough; more only help, as
// merging is by max.
func (r *Replicator) sync(ctx context.Context, nc *nats.Conn, why string) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, r.cfg.WarmStartTimeout)
	defer cancel()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		r.log.Warn("sync: subscribe", "err", err)
		return
	}
	defer sub.Unsubscribe()
	req := (&Message{Header: Header{Kind: KindSyncRequest, Node: r.self.Node, Incarnation: r.self.Incarnation, SentAtMS: r.now().UnixMilli()}}).Encode(nil)
	if err := nc.PublishRequest(r.syncSubj, inbox, req); err != nil {
		r.log.Warn("sync: request", "err", err)
		return
	}
	type progress struct {
		next   uint64
		broken bool
	}
	var (
		replies  = map[peerKey]*progress{}
		complete int
		merged   int
		m        Message
		outcome  = "deadline"
		wait     = ctx // shortened to a grace period once a reply is complete
	)
	for {
		msg, err := sub.NextMsgWithContext(wait)
		if err != nil {
			if errors.Is(err, nats.ErrNoResponders) {
				outcome = "no peers"
			}
			break
		}
		now := r.now()
		if !r.read(msg.Data, &m, KindSyncReply) {
			continue
		}
		k := peerKey{m.Node, m.Incarnation}
		pr := replies[k]
		if pr == nil {
			if len(replies) >= r.cfg.MaxPeers {
				continue
			}
			pr = &progress{}
			replies[k] = pr
		}
		if m.Seq != pr.next {
			pr.broken = true // a chunk was lost (slow consumer): use what came
		}
		pr.next = m.Seq + 1
		merged += r.mergeReply(&m, now)
		if m.Last && !pr.broken {
			complete++
			if wait == ctx {
				var cancelGrace context.CancelFunc
				wait, cancelGrace = context.WithTimeout(ctx, 2*r.cfg.SyncInterval)
				defer cancelGrace()
				outcome = "complete"
			}
		}
	}
	if complete == 0 && len(replies) > 0 {
		r.m.syncFailed.Inc()
	}
	r.log.Info("synced counts from peers", "why", why, "outcome", outcome, "peers_answered", len(replies),
		"complete", complete, "counts_merged", merged, "took", time.Since(start).Round(time.Millisecond).String())
}

// mergeReply merges one chunk of a sync reply.
func (r *Replicator) mergeReply(m *Message, now time.Time) int {
	ids := r.originIDs(m, now)
	n := r.merge(m, func(i int) counter.PeerID { return ids[i] }, now)
	r.m.syncMerged.Add(float64(n))
	return n
}

// originIDs maps a sync reply's origins to peer ids: this process is Self
// (its own counts, skipped), every other origin a peer (added if there is
// room; an origin over the peer bound maps to Self too, and is skipped).
func (r *Replicator) originIDs(m *Message, now time.Time) []counter.PeerID {
	ids := make([]counter.PeerID, len(m.Origins))
	for i, o := range m.Origins {
		if o == r.self {
			continue
		}
		if p := r.peers.get(o.Node, o.Incarnation, now); p != nil {
			ids[i] = p.id
		} else {
			r.m.peersRefused.Inc()
		}
	}
	return ids
}
