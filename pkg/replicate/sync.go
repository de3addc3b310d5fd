package replicate

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ratelimit-authz/ratelimit-authz/pkg/counter"
)

// inboxPrefix is the only kind of reply subject a sync request may name:
// nats.go's request inboxes. A request cannot make a node publish its
// counts on another subject (and NATS permissions, see deploy/nats, stop
// anyone else from reading the inboxes).
const inboxPrefix = "_INBOX."

// validReply reports whether subj is an inbox subject without wildcards.
func validReply(subj string) bool {
	if len(subj) <= len(inboxPrefix) || len(subj) > 256 || !strings.HasPrefix(subj, inboxPrefix) {
		return false
	}
	for _, tok := range strings.Split(subj, ".") {
		if tok == "" || tok == "*" || tok == ">" {
			return false
		}
	}
	for i := 0; i < len(subj); i++ {
		if subj[i] <= ' ' || subj[i] > '~' {
			return false
		}
	}
	return true
}

// tokenBucket admits up to max events at once, refilled at rate per
// second. Safe for concurrent use.
type tokenBucket struct {
	mu        sync.Mutex
	max, rate float64
	tokens    float64
	at        time.Time
}

func (b *tokenBucket) allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.at.IsZero() {
		b.tokens, b.at = b.max, now
	}
	if el := now.Sub(b.at).Seconds(); el > 0 {
		b.tokens = min(b.max, b.tokens+el*b.rate)
		b.at = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// onSyncRequest answers a peer's sync request with every count this node
// holds for live windows, in as many chunks as the message size needs:
// only an authenticated request, only to an inbox, and at most
// SyncAnswersPerSecond of them in all, from a snapshot at most a second
// old whatever the request says.
func (r *Replicator) onSyncRequest(msg *nats.Msg) {
	now := r.now()
	m := &r.reqRx
	if !r.read(msg.Data, m, kindSyncRequest, &r.reqBuf, now) {
		return
	}
	if !validReply(msg.Reply) {
		r.m.syncRefused[refusedReply].Inc()
		return
	}
	if !r.answers.allow(time.Now()) {
		r.m.syncRefused[refusedRate].Inc()
		return
	}
	nc := r.conn.Load()
	if nc == nil {
		return
	}
	asked := time.UnixMilli(m.SentAtMS)
	if wait := r.syncWait(asked, now); wait > 0 {
		// The cached snapshot predates the request, and a new one may not
		// be taken yet: wait for it (at most a second; the requester waits
		// longer), rather than answer with counts older than the request.
		time.Sleep(wait)
		now = r.now()
	}
	for _, chunk := range r.syncReply(r.maxOut(nc), now) {
		if err := r.publish(nc, msg.Reply, chunk); err != nil {
			r.m.publishErrors.Inc()
			r.log.Warn("answer a sync request", "peer", m.Node, "err", err)
			return
		}
	}
	r.m.syncServed.Inc()
	r.log.Debug("answered a sync request", "peer", m.Node)
}

// syncWait is how long a request sent at asked (the requester's clock,
// within MaxClockSkew of now) waits before its answer: until a snapshot
// may be taken again, when the cached one was taken before asked.
func (r *Replicator) syncWait(asked, now time.Time) time.Duration {
	r.syncMu.Lock()
	defer r.syncMu.Unlock()
	if r.syncCache == nil || !r.syncAt.Before(asked) || now.Before(r.syncAt) {
		return 0
	}
	return r.syncAt.Add(syncCacheAt).Sub(now)
}

// syncReply returns the sealed chunks of a sync reply. A reply built less
// than a second ago is reused, whatever the request: a burst of requests
// (every node reconnecting at once after a NATS restart, or a flood) costs
// one pass over the store per second at most. (onSyncRequest waits for a
// newer one when the cached one predates the request.)
func (r *Replicator) syncReply(max int, now time.Time) [][]byte {
	r.syncMu.Lock()
	defer r.syncMu.Unlock()
	if r.syncCache != nil && now.Sub(r.syncAt) < syncCacheAt && !now.Before(r.syncAt) {
		return r.syncCache
	}
	r.snap = r.store.Snapshot(r.snap[:0], now)
	var chunks [][]byte
	sp := r.syncSplit
	sp.max = max
	sp.emit = func(b []byte) error {
		chunks = append(chunks, append([]byte(nil), r.sealed(&r.syncSeal, &r.syncAD, b, kindSyncReply)...))
		return nil
	}
	sp.start(header{Kind: kindSyncReply, Node: r.self.Node, Incarnation: r.self.Incarnation, SentAtMS: now.UnixMilli()})
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
		l := wireLimit{Name: r.cfg.Buckets[pc.Bucket], ScaleMS: pc.ScaleMS, Algorithm: pc.Algorithm}
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
	req := (&message{header: header{Kind: kindSyncRequest, Node: r.self.Node, Incarnation: r.self.Incarnation, SentAtMS: r.now().UnixMilli()}}).encode(nil)
	var sealBuf, adBuf []byte
	if err := nc.PublishRequest(r.syncSubj, inbox, r.sealed(&sealBuf, &adBuf, req, kindSyncRequest)); err != nil {
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
		m        message
		buf      rxBuffers
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
		if !r.read(msg.Data, &m, kindSyncReply, &buf, now) {
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
func (r *Replicator) mergeReply(m *message, now time.Time) int {
	ids := r.originIDs(m, now)
	n := r.merge(m, func(i int) counter.PeerID { return ids[i] }, now)
	r.m.syncMerged.Add(float64(n))
	return n
}

// originIDs maps a sync reply's origins to peer ids: this process is Self
// (its own counts, skipped), every other origin a peer (added if there is
// room; an origin over the peer bound maps to Self too, and is skipped).
func (r *Replicator) originIDs(m *message, now time.Time) []counter.PeerID {
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
