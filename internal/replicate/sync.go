package replicate

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
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

// syncer asks peers for their counts (at the warm start, and to catch up
// after a reconnection or lost messages) and answers their requests.
type syncer struct {
	*shared
	recv *receiver // merges the replies

	// resync asks run for a sync (buffered, one pending at most).
	resync   chan struct{}
	lastSync atomic.Int64 // unix ms a sync request of ours last started
	syncing  atomic.Bool  // one of ours runs

	// Requests are handled one at a time (one subscription).
	reqRx   message
	reqBuf  rxBuffers
	answers tokenBucket

	// The cached reply, rebuilt at most once a second.
	mu      sync.Mutex
	cache   [][]byte
	cacheAt time.Time
	split   *splitter
	sealBuf []byte
	sealAD  []byte
	snap    []counter.PeerCount
}

func newSyncer(sh *shared, recv *receiver) *syncer {
	return &syncer{
		shared:  sh,
		recv:    recv,
		resync:  make(chan struct{}, 1),
		answers: tokenBucket{max: float64(sh.cfg.SyncAnswersPerSecond), rate: float64(sh.cfg.SyncAnswersPerSecond)},
		split:   newSplitter(sh.cfg.MaxMessageBytes, nil),
	}
}

// requestResync asks run for a sync, without blocking.
func (s *syncer) requestResync() {
	select {
	case s.resync <- struct{}{}:
	default:
	}
}

// run syncs with the peers when asked, at most once a second, until ctx is
// done; it then waits for the sync in progress to end. With warm set it
// starts with the warm start, and calls ready when that ends.
func (s *syncer) run(ctx context.Context, nc *nats.Conn, warm bool, ready func()) {
	var wg sync.WaitGroup
	defer wg.Wait()
	if warm {
		s.start(ctx, &wg, nc, "warm start", ready)
	}
	// A resync asked for within a second of the last sync start, or while
	// one runs, is deferred (resyncT), not dropped: what was lost after
	// that sync began must still be caught up on.
	resyncT := time.NewTimer(time.Hour)
	resyncT.Stop()
	defer resyncT.Stop()
	armed := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.resync:
			// A (re)connect, or messages lost unread: catch up on what
			// peers counted meanwhile, at most one sync a second.
			if armed {
				break
			}
			wait := syncCacheAt - time.Duration(s.now().UnixMilli()-s.lastSync.Load())*time.Millisecond
			if wait <= 0 && s.start(ctx, &wg, nc, "resync", nil) {
				break
			}
			resyncT.Reset(max(wait, syncCacheAt/10))
			armed = true
		case <-resyncT.C:
			armed = false
			if !s.start(ctx, &wg, nc, "resync", nil) {
				resyncT.Reset(syncCacheAt / 10) // one is running: once it ends
				armed = true
			}
		}
	}
}

// start starts a sync in wg unless one runs; then, if set, runs after it.
func (s *syncer) start(ctx context.Context, wg *sync.WaitGroup, nc *nats.Conn, why string, then func()) bool {
	if !s.syncing.CompareAndSwap(false, true) {
		return false
	}
	s.lastSync.Store(s.now().UnixMilli())
	wg.Go(func() {
		defer s.syncing.Store(false)
		s.guard("sync reply", func(*nats.Msg) { s.request(ctx, nc, why) })(nil)
		if then != nil {
			then()
		}
	})
	return true
}

// dropReply forgets the cached reply once it may no longer be reused: a
// reply can be large.
func (s *syncer) dropReply(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache != nil && now.Sub(s.cacheAt) >= syncCacheAt {
		s.cache = nil
	}
}

// onRequest answers a peer's sync request with every count this node
// holds for live windows, in as many chunks as the message size needs:
// only an authenticated request, only to an inbox, and at most
// SyncAnswersPerSecond of them in all, from a snapshot at most a second
// old whatever the request says.
func (s *syncer) onRequest(nc *nats.Conn, msg *nats.Msg) {
	now := s.now()
	m := &s.reqRx
	if !s.read(msg.Data, m, kindSyncRequest, &s.reqBuf, now) {
		return
	}
	if !validReply(msg.Reply) {
		s.m.syncRefused.reply.Inc()
		return
	}
	if !s.answers.allow(now) {
		s.m.syncRefused.rate.Inc()
		return
	}
	asked := time.UnixMilli(m.SentAtMS)
	if wait := s.replyWait(asked, now); wait > 0 {
		// The cached snapshot predates the request, and a new one may not
		// be taken yet: wait for it (at most a second; the requester waits
		// longer), rather than answer with counts older than the request.
		time.Sleep(wait)
		now = s.now()
	}
	for _, chunk := range s.reply(s.maxOut(nc), now) {
		if err := s.hooks.send(nc, msg.Reply, chunk); err != nil {
			s.m.publishErrors.Inc()
			s.log.Warn("answer a sync request", "peer", m.origin().String(), "err", err)
			return
		}
	}
	s.m.syncServed.Inc()
	s.log.Debug("answered a sync request", "peer", m.origin().String())
}

// replyWait is how long a request sent at asked (the requester's clock,
// within MaxClockSkew of now) waits before its answer: until a snapshot
// may be taken again, when the cached one was taken before asked.
func (s *syncer) replyWait(asked, now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache == nil || !s.cacheAt.Before(asked) || now.Before(s.cacheAt) {
		return 0
	}
	return s.cacheAt.Add(syncCacheAt).Sub(now)
}

// reply returns the sealed chunks of a sync reply. A reply built less
// than a second ago is reused, whatever the request: a burst of requests
// (every node reconnecting at once after a NATS restart, or a flood) costs
// one pass over the store per second at most. (onRequest waits for a
// newer one when the cached one predates the request.)
func (s *syncer) reply(max int, now time.Time) [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache != nil && now.Sub(s.cacheAt) < syncCacheAt && !now.Before(s.cacheAt) {
		return s.cache
	}
	s.snap = s.store.LiveCounts(s.snap[:0], now)
	var chunks [][]byte
	sp := s.split
	sp.max = max
	sp.emit = func(b []byte) error {
		chunks = append(chunks, append([]byte(nil), s.sealed(&s.sealBuf, &s.sealAD, b, kindSyncReply)...))
		return nil
	}
	sp.start(header{Kind: kindSyncReply, Node: s.self.Node, Incarnation: s.self.Incarnation, SentAtMS: now.UnixMilli()})
	tab := s.tab.Load()
	for i := range s.snap {
		pc := &s.snap[i]
		name := tab.name(pc.Bucket)
		if name == "" {
			continue // a bucket a reload removed
		}
		o := s.self
		if pc.Peer != counter.Self {
			var ok bool
			if o, ok = s.peers.identity(pc.Peer); !ok {
				continue // forgotten peer: its counts stay here, but cannot be named
			}
		}
		l := wireLimit{Name: name, ScaleMS: pc.ScaleMS, Algorithm: pc.Algorithm}
		_ = sp.add(l, o, pc.Window, pc.Key, pc.Count) // too large for any message: left out
	}
	_ = sp.flush(true)
	clear(s.snap) // drop the key strings
	s.cache, s.cacheAt = chunks, now
	return chunks
}

// request asks the peers for their counts and merges the replies until one
// peer's reply is complete (plus a short grace for the others) or
// WarmStartTimeout has passed. Every complete reply holds the counts of
// every node its sender knows, so one is enough; more only help, as
// merging is by max.
func (s *syncer) request(ctx context.Context, nc *nats.Conn, why string) {
	start := s.now()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WarmStartTimeout)
	defer cancel()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		s.log.Warn("sync: subscribe", "err", err)
		return
	}
	defer sub.Unsubscribe()
	req := (&message{header: header{Kind: kindSyncRequest, Node: s.self.Node, Incarnation: s.self.Incarnation, SentAtMS: s.now().UnixMilli()}}).encode(nil)
	var sealBuf, adBuf []byte
	if err := nc.PublishRequest(s.syncSubj, inbox, s.sealed(&sealBuf, &adBuf, req, kindSyncRequest)); err != nil {
		s.log.Warn("sync: request", "err", err)
		return
	}
	type progress struct {
		next   uint64
		broken bool
	}
	var (
		replies  = map[origin]*progress{}
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
		now := s.now()
		if !s.read(msg.Data, &m, kindSyncReply, &buf, now) {
			continue
		}
		k := m.origin()
		pr := replies[k]
		if pr == nil {
			if len(replies) >= s.cfg.MaxPeers {
				continue
			}
			pr = &progress{}
			replies[k] = pr
		}
		if m.Seq != pr.next {
			pr.broken = true // a chunk was lost (slow consumer): use what came
		}
		pr.next = m.Seq + 1
		merged += s.mergeReply(&m, now)
		if m.Last && !pr.broken {
			complete++
			if wait == ctx {
				var cancelGrace context.CancelFunc
				wait, cancelGrace = context.WithTimeout(ctx, 2*s.cfg.SyncInterval)
				defer cancelGrace()
				outcome = "complete"
			}
		}
	}
	if complete == 0 && len(replies) > 0 {
		s.m.syncFailed.Inc()
	}
	s.log.Info("synced counts from peers", "why", why, "outcome", outcome, "peers_answered", len(replies),
		"complete", complete, "counts_merged", merged, "took", s.now().Sub(start).Round(time.Millisecond).String())
}

// mergeReply merges one chunk of a sync reply. Its sender is heard from.
func (s *syncer) mergeReply(m *message, now time.Time) int {
	s.peers.get(m.Node, m.Incarnation, now, true) // over the peer bound: its counts are refused below
	ids := s.originIDs(m, now)
	n := s.recv.merge(m, func(i int) counter.PeerID { return ids[i] }, now)
	s.m.syncMerged.Add(float64(n))
	return n
}

// originIDs maps a sync reply's origins to peer ids: this process is Self
// (its own counts, skipped), every other origin a peer (added if there is
// room; an origin over the peer bound maps to Self too, and is skipped).
// An origin is not heard from: it may have stopped long ago (this node's
// own previous incarnation, after a restart), and only a process heard
// from is live (takes a share, or claims its node id).
func (s *syncer) originIDs(m *message, now time.Time) []counter.PeerID {
	ids := make([]counter.PeerID, len(m.Origins))
	for i, o := range m.Origins {
		if o == s.self {
			continue
		}
		if p := s.peers.get(o.Node, o.Incarnation, now, false); p != nil {
			ids[i] = p.id
		} else {
			s.m.peersRefused.Inc()
		}
	}
	return ids
}
