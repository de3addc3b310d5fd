package replicate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/pkg/counter"
)

// Store is what the Replicator needs of the counter store. *counter.Store
// is one; it must be created with counter.Config.Track set.
type Store interface {
	Changes(dst []counter.WindowCount, now time.Time) ([]counter.WindowCount, int)
	Merge(peer counter.PeerID, c counter.WindowCount, now time.Time) counter.MergeStatus
	Snapshot(dst []counter.PeerCount, now time.Time) []counter.PeerCount
	Pending() int
}

// nearLimiter is the optional part of a Store that tells when a local
// count came near its limit; *counter.Store is one (with Track set).
type nearLimiter interface {
	NearLimit() <-chan struct{}
}

var _ Store = (*counter.Store)(nil)

// Defaults of a zero Config field.
const (
	DefaultSubjectPrefix    = "ratelimit"
	DefaultSyncInterval     = 100 * time.Millisecond
	DefaultWarmStartTimeout = 2 * time.Second
	DefaultMaxPeers         = 64
	DefaultPeerExpiry       = time.Minute
	DefaultSkewWarning      = 500 * time.Millisecond
	DefaultFlushTimeout     = 2 * time.Second
	DefaultHeartbeat        = time.Second
	DefaultAntiEntropy      = 10 * time.Second
	DefaultMaxClockSkew     = 30 * time.Second
	// DefaultSyncAnswersPerSecond bounds the sync requests a node answers,
	// from all requesters together (a burst of this many, refilled at this
	// rate): every node reconnecting at once after a NATS restart still
	// gets an answer from some peer, a flood of requests costs little.
	DefaultSyncAnswersPerSecond = 4
	// DefaultMaxMessageBytes bounds the messages read (and written, with the
	// server's max_payload, whichever is smaller).
	DefaultMaxMessageBytes = 8 << 20
)

// Internal bounds.
const (
	maxPending  = 1 << 16 // counts kept for a retry after a failed publish, or deferred
	syncCacheAt = time.Second
)

// Config configures a Replicator. A zero field means its default.
type Config struct {
	// URL is the NATS server URL, or several separated by commas. Required.
	URL string
	// Options are nats.go options for credentials and TLS (UserCredentials,
	// Nkey, UserInfo, Token, RootCAs, ClientCert, …). The Replicator adds
	// its own after them: NoEcho, RetryOnFailedConnect, unlimited
	// reconnects, and its connection handlers.
	Options []nats.Option
	// Buckets are the configured bucket names, indexed like the counter's
	// bucket numbers. Batches name buckets, so nodes whose configurations
	// differ (during a rollout) agree on the buckets they share. Required.
	Buckets []string
	// NodeID names this node to its peers (metrics labels, logs); default
	// the host name. Each process start adds a random incarnation, so two
	// processes never share an identity.
	NodeID string
	// SubjectPrefix: batches go to <prefix>.batch, sync requests to
	// <prefix>.sync; default "ratelimit".
	SubjectPrefix string
	// SyncInterval is how often changed counts are published; 100 ms.
	SyncInterval time.Duration
	// WarmStartTimeout bounds the wait for peers' counts before Ready; 2 s.
	WarmStartTimeout time.Duration
	// MaxPeers bounds the peers tracked at once; 64.
	MaxPeers int
	// PeerExpiry: a peer silent this long (no batch, no heartbeat) is
	// forgotten; 1 min. If it speaks again it gets its old peer id back.
	PeerExpiry time.Duration
	// SkewWarning: a peer whose batches arrive with a larger clock
	// difference is logged (at most once a minute); 500 ms.
	SkewWarning time.Duration
	// MaxMessageBytes bounds messages read and written; 8 MiB (writes are
	// also bounded by the server's max_payload).
	MaxMessageBytes int
	// FlushTimeout bounds the final publish at shutdown; 2 s.
	FlushTimeout time.Duration
	// EarlyGap is the least time between two early batches: when a local
	// hit leaves a key near its limit (see counter.Store.NearLimit), the
	// node publishes its changes at once rather than at the next tick,
	// but at most once per EarlyGap (a signal within the gap is served
	// at its end). Default SyncInterval/10; negative turns early batches
	// off.
	EarlyGap time.Duration

	// Keys are the cluster keys, KeySize bytes each: messages are sealed
	// with the first and opened with either (a rotation: add the new key
	// as second, then make it first everywhere, then drop the old one).
	// None: messages are neither sealed nor authenticated — anyone who
	// can publish on the subjects can then change counts (see
	// docs/security.md).
	Keys [][]byte
	// Bounds says which window lengths and counts a peer may report per
	// bucket; nil accepts every window and count the counter takes.
	Bounds Bounds
	// Heartbeat: a node that published nothing for this long publishes an
	// empty batch, so that peers know it is alive; 1 s.
	Heartbeat time.Duration
	// AntiEntropy is the period over which every live count of this node
	// is published again, a part with each batch, so that a lost batch of
	// a key that stopped changing is repaired within about this period;
	// 10 s, negative turns it off.
	AntiEntropy time.Duration
	// MaxClockSkew: a message whose send time is further than this from
	// this node's clock is dropped (a replay, or a clock that is off); 30 s.
	MaxClockSkew time.Duration
	// SyncAnswersPerSecond bounds the sync requests answered, in all; 4.
	SyncAnswersPerSecond int
}

func (c *Config) setDefaults() error {
	if c.URL == "" {
		return errors.New("replicate: no NATS URL")
	}
	if len(c.Buckets) == 0 {
		return errors.New("replicate: no buckets")
	}
	seen := make(map[string]bool, len(c.Buckets))
	for _, b := range c.Buckets {
		if b == "" || len(b) > maxNameLen || seen[b] {
			return fmt.Errorf("replicate: bucket name %q is empty, too long or repeated", b)
		}
		seen[b] = true
	}
	if c.NodeID == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return fmt.Errorf("replicate: no node id and no host name: %v", err)
		}
		c.NodeID = h
	}
	if !validNode(c.NodeID) {
		return fmt.Errorf("replicate: node id %q: want 1 to %d bytes of printable ASCII without spaces", c.NodeID, maxNodeLen)
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = DefaultSubjectPrefix
	}
	for _, tok := range strings.Split(c.SubjectPrefix, ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
			return fmt.Errorf("replicate: subject prefix %q is not a valid NATS subject without wildcards", c.SubjectPrefix)
		}
	}
	for _, d := range []struct {
		p   *time.Duration
		def time.Duration
	}{
		{&c.SyncInterval, DefaultSyncInterval}, {&c.WarmStartTimeout, DefaultWarmStartTimeout},
		{&c.PeerExpiry, DefaultPeerExpiry}, {&c.SkewWarning, DefaultSkewWarning}, {&c.FlushTimeout, DefaultFlushTimeout},
		{&c.Heartbeat, DefaultHeartbeat}, {&c.MaxClockSkew, DefaultMaxClockSkew},
	} {
		if *d.p < 0 {
			return fmt.Errorf("replicate: negative duration %v", *d.p)
		}
		if *d.p == 0 {
			*d.p = d.def
		}
	}
	if c.EarlyGap == 0 {
		c.EarlyGap = c.SyncInterval / 10
	}
	if c.AntiEntropy == 0 {
		c.AntiEntropy = DefaultAntiEntropy
	}
	if c.SyncAnswersPerSecond < 0 {
		return fmt.Errorf("replicate: negative SyncAnswersPerSecond %d", c.SyncAnswersPerSecond)
	}
	if c.SyncAnswersPerSecond == 0 {
		c.SyncAnswersPerSecond = DefaultSyncAnswersPerSecond
	}
	if c.MaxPeers < 0 || c.MaxPeers > 1<<16 {
		return fmt.Errorf("replicate: MaxPeers %d outside [0, 65536]", c.MaxPeers)
	}
	if c.MaxPeers == 0 {
		c.MaxPeers = DefaultMaxPeers
	}
	if c.MaxMessageBytes < 0 {
		return fmt.Errorf("replicate: negative MaxMessageBytes %d", c.MaxMessageBytes)
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.MaxMessageBytes < 1024 {
		return fmt.Errorf("replicate: MaxMessageBytes %d is below 1024", c.MaxMessageBytes)
	}
	return nil
}

// Replicator shares a counter store's counts with the other nodes over
// NATS. Create it with New and run it with Run. Its methods are safe for
// concurrent use.
type Replicator struct {
	cfg       Config
	store     Store
	log       *slog.Logger
	m         *metrics
	self      origin // node id and this process's incarnation
	bucketIdx map[string]counter.Bucket
	batchSubj string
	syncSubj  string
	peers     *peerTable
	seal      *sealer // nil: no cluster key

	// publishMu is held for a whole publish, and by the pending_entries
	// gauge: changes taken out of the store but not yet sent still count
	// as pending, so "0 pending" means "all sent".
	publishMu sync.Mutex

	started atomic.Bool
	ready   chan struct{}
	readyMu sync.Once
	conn    atomic.Pointer[nats.Conn]
	resync  chan struct{}

	// now is the clock (tests replace it); publish sends one message
	// (tests drop or repeat some).
	now     func() time.Time
	publish func(nc *nats.Conn, subject string, data []byte) error
	kick    chan chan struct{} // tests: tick now, then close the channel sent (nil: never)
	// subPending, if positive, bounds the messages a subscription holds
	// unread (tests; else nats.go's default).
	subPending int

	// State of the publishing loop (one goroutine).
	split   *splitter
	seq     uint64
	changes []counter.WindowCount
	retry   []counter.WindowCount

	// Counts for now's window + 1 that the store could not take yet.
	deferMu  sync.Mutex
	deferred []deferredCount

	// Buffers of the publishing loop: sealed output, additional data.
	sealBuf, sealAD []byte
	lastSent        time.Time // r.now of the last batch or heartbeat
	// Anti-entropy: this node's live counts, re-sent a part per tick.
	aeQueue []counter.WindowCount
	aeSnap  []counter.PeerCount
	aeNext  time.Time
	aeShare int // counts per tick

	// Received batches are handled one at a time (one subscription).
	rx    message
	rxBuf rxBuffers

	// Sync requests: handled one at a time (one subscription).
	reqRx   message
	reqBuf  rxBuffers
	answers tokenBucket

	// Cached sync reply chunks, rebuilt at most once a second.
	syncMu    sync.Mutex
	syncCache [][]byte
	syncAt    time.Time
	syncSplit *splitter
	syncSeal  []byte
	syncAD    []byte
	snap      []counter.PeerCount
	lastSync  atomic.Int64 // unix ms a sync request of ours last started
	syncing   atomic.Bool
}

type deferredCount struct {
	peer counter.PeerID
	wc   counter.WindowCount
}

// New returns a Replicator for store, which must track changes
// (counter.Config.Track). Nothing is started until Run.
func New(cfg Config, store Store, reg prometheus.Registerer, log *slog.Logger) (*Replicator, error) {
	if store == nil || reg == nil || log == nil {
		return nil, errors.New("replicate: New needs a store, a registerer and a logger")
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	r := &Replicator{
		cfg:       cfg,
		store:     store,
		log:       log.With("node", cfg.NodeID),
		self:      origin{Node: cfg.NodeID, Incarnation: rand.Uint64()},
		bucketIdx: make(map[string]counter.Bucket, len(cfg.Buckets)),
		batchSubj: cfg.SubjectPrefix + ".batch",
		syncSubj:  cfg.SubjectPrefix + ".sync",
		ready:     make(chan struct{}),
		resync:    make(chan struct{}, 1),
		now:       time.Now,
		publish:   func(nc *nats.Conn, subj string, data []byte) error { return nc.Publish(subj, data) },
	}
	for i, b := range cfg.Buckets {
		r.bucketIdx[b] = counter.Bucket(i)
	}
	m, err := newMetrics(reg, r.gauges)
	if err != nil {
		return nil, err
	}
	r.m = m
	r.peers = newPeerTable(cfg.MaxPeers)
	if r.seal, err = newSealer(cfg.Keys, cfg.SubjectPrefix); err != nil {
		return nil, err
	}
	r.answers = tokenBucket{max: float64(cfg.SyncAnswersPerSecond), rate: float64(cfg.SyncAnswersPerSecond)}
	r.split = newSplitter(cfg.MaxMessageBytes, nil)
	r.syncSplit = newSplitter(cfg.MaxMessageBytes, nil)
	return r, nil
}

func (r *Replicator) gauges(ns, sub string) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "connected",
			Help: "1 while connected to NATS, else 0 (the node then limits on its own counts).",
		}, func() float64 {
			if nc := r.conn.Load(); nc != nil && nc.IsConnected() {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "reconnects_total",
			Help: "Reconnections to NATS.",
		}, func() float64 {
			if nc := r.conn.Load(); nc != nil {
				return float64(nc.Stats().Reconnects)
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "peers",
			Help: "Peers heard from within the peer expiry.",
		}, func() float64 { return float64(r.peers.len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "clock_skew_seconds",
			Help: "Largest absolute difference, over the known peers, between receive time and the peer's send time of its latest batch (clock skew plus delivery delay).",
		}, func() float64 { return r.peers.maxSkew().Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "pending_entries",
			Help: "Keys with changed counts not yet published (grows while NATS is away).",
		}, func() float64 {
			r.publishMu.Lock()
			defer r.publishMu.Unlock()
			return float64(r.store.Pending())
		}),
	}
}

// Ready is closed once the warm start has ended: peers answered, the
// deadline passed, or NATS was not reachable at start.
func (r *Replicator) Ready() <-chan struct{} { return r.ready }

func (r *Replicator) markReady() { r.readyMu.Do(func() { close(r.ready) }) }

// Identity is this process's node id and incarnation.
func (r *Replicator) Identity() (node string, incarnation uint64) {
	return r.self.Node, r.self.Incarnation
}

// Run connects to NATS and replicates until ctx is done; it then publishes
// a last batch (bounded by FlushTimeout), closes the connection and returns
// nil. NATS being unreachable is not an error: the connection is retried
// in the background for as long as Run runs. Run returns an error only for
// options nats.go refuses (an unreadable credentials file, say) or when
// called twice.
func (r *Replicator) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("replicate: Run called twice")
	}
	defer r.markReady()
	var offline atomic.Bool // NATS was not reachable when Run started
	opts := append(slices.Clone(r.cfg.Options),
		nats.Name("ratelimit-authz "+r.cfg.NodeID),
		nats.NoEcho(),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		nats.PingInterval(10*time.Second),
		nats.MaxPingsOutstanding(3),
		nats.ConnectHandler(func(*nats.Conn) {
			r.log.Info("connected to NATS")
			if offline.Load() { // else the warm start covers this connection
				r.requestResync()
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			r.log.Info("reconnected to NATS", "url", nc.ConnectedUrlRedacted())
			r.requestResync()
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if ctx.Err() == nil {
				r.log.Warn("disconnected from NATS; limiting on this node's counts until it is back", "err", err)
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) {
				// Messages were dropped before this node read them: some
				// of peers' counts may be missing; ask for all of them.
				r.m.slowConsumer.Inc()
				r.log.Warn("NATS slow consumer: messages dropped before they were read; resyncing from peers", "err", err)
				r.requestResync()
				return
			}
			r.log.Warn("NATS asynchronous error", "err", err)
		}),
	)
	nc, err := nats.Connect(r.cfg.URL, opts...)
	if err != nil {
		return fmt.Errorf("replicate: connect to NATS: %w", err)
	}
	r.conn.Store(nc)
	defer nc.Close()
	for subj, h := range map[string]nats.MsgHandler{
		r.batchSubj: r.guard("batch", r.onBatch),
		r.syncSubj:  r.guard("sync request", r.onSyncRequest),
	} {
		sub, err := nc.Subscribe(subj, h)
		if err != nil {
			return fmt.Errorf("replicate: subscribe %s: %w", subj, err)
		}
		if r.subPending > 0 {
			if err := sub.SetPendingLimits(r.subPending, -1); err != nil {
				return fmt.Errorf("replicate: pending limits of %s: %w", subj, err)
			}
		}
	}

	var wg sync.WaitGroup
	syncCtx, cancelSync := context.WithCancel(ctx)
	defer cancelSync()
	startSync := func(why string, then func()) bool {
		if !r.syncing.CompareAndSwap(false, true) {
			return false
		}
		r.lastSync.Store(r.now().UnixMilli())
		wg.Go(func() {
			defer r.syncing.Store(false)
			r.guard("sync reply", func(*nats.Msg) { r.sync(syncCtx, nc, why) })(nil)
			if then != nil {
				then()
			}
		})
		return true
	}
	// A resync asked for within a second of the last sync start, or while
	// one runs, is deferred (resyncT), not dropped: what was lost after
	// that sync began must still be caught up on.
	resyncT := time.NewTimer(time.Hour)
	resyncT.Stop()
	defer resyncT.Stop()
	resyncArmed := false
	if nc.IsConnected() {
		startSync("warm start", r.markReady)
	} else {
		offline.Store(true)
		r.log.Warn("NATS not reachable at start; serving on this node's counts and retrying in the background", "url", redactURLs(r.cfg.URL))
		r.markReady()
		if nc.IsConnected() { // connected just now, perhaps before the flag was set
			r.requestResync()
		}
	}

	t := time.NewTimer(r.untilTick(r.now()))
	defer t.Stop()
	// Early batches: near receives when a local hit left a key near its
	// limit; one is published at once unless one went out less than
	// EarlyGap ago, in which case gapT publishes it when the gap ends.
	var near <-chan struct{}
	if nl, ok := r.store.(nearLimiter); ok && r.cfg.EarlyGap > 0 {
		near = nl.NearLimit()
	}
	gapT := time.NewTimer(time.Hour)
	gapT.Stop()
	defer gapT.Stop()
	var lastEarly time.Time // monotonic: the gap is measured on time.Now, not r.now
	gapArmed := false
	early := func() {
		lastEarly = time.Now()
		r.early(nc, r.now())
	}
	for {
		select {
		case <-ctx.Done():
			cancelSync()
			wg.Wait()
			r.final(nc)
			return nil
		case <-r.resync:
			// A (re)connect, or messages lost unread: catch up on what
			// peers counted meanwhile, at most one sync a second.
			if resyncArmed {
				break
			}
			wait := syncCacheAt - time.Duration(r.now().UnixMilli()-r.lastSync.Load())*time.Millisecond
			if wait <= 0 && startSync("resync", nil) {
				break
			}
			resyncT.Reset(max(wait, syncCacheAt/10))
			resyncArmed = true
		case <-resyncT.C:
			resyncArmed = false
			if !startSync("resync", nil) {
				resyncT.Reset(syncCacheAt / 10) // one is running: once it ends
				resyncArmed = true
			}
		case <-t.C:
			r.tick(nc, r.now())
			t.Reset(r.untilTick(r.now()))
		case done := <-r.kick:
			r.tick(nc, r.now())
			close(done)
		case <-near:
			if gapArmed {
				break // the gap's end publishes this one too
			}
			if wait := r.cfg.EarlyGap - time.Since(lastEarly); wait > 0 {
				gapT.Reset(wait)
				gapArmed = true
				break
			}
			early()
		case <-gapT.C:
			gapArmed = false
			early()
		}
	}
}

// untilTick is the time from now to the next multiple of SyncInterval
// since the Unix epoch. Like windows, ticks are aligned to the wall clock:
// with synchronised clocks every node publishes at the same instants, so at
// any moment each node knows every peer's counts as of the last tick, and
// a window of a multiple of the interval begins with a fresh view.
func (r *Replicator) untilTick(now time.Time) time.Duration {
	d := r.cfg.SyncInterval.Nanoseconds()
	n := now.UnixNano()
	return time.Duration((counter.WindowOf(n, d)+1)*d - n)
}

func (r *Replicator) requestResync() {
	select {
	case r.resync <- struct{}{}:
	default:
	}
}

// final publishes what changed since the last batch, at shutdown.
func (r *Replicator) final(nc *nats.Conn) {
	r.tick(nc, r.now())
	if !nc.IsConnected() {
		return
	}
	if err := nc.FlushTimeout(r.cfg.FlushTimeout); err != nil {
		r.log.Warn("final batch not confirmed by NATS", "err", err, "timeout", r.cfg.FlushTimeout.String())
		return
	}
	r.log.Info("final batch published")
}

// tick is one sync interval: retry deferred counts, forget silent peers,
// and publish this node's changes if NATS is there (or a heartbeat when
// there are none). While it is not, the changes stay marked in the store
// and go out, at their latest counts, in the first batch after it is back.
func (r *Replicator) tick(nc *nats.Conn, now time.Time) {
	r.retryDeferred(now)
	r.peers.expire(now, r.cfg.PeerExpiry)
	r.syncMu.Lock()
	if r.syncCache != nil && now.Sub(r.syncAt) >= syncCacheAt {
		r.syncCache = nil // a reply can be large; keep it only while it may be reused
	}
	r.syncMu.Unlock()
	if !nc.IsConnected() {
		return
	}
	r.publishTick(now, r.maxOut(nc), func(b []byte) error { return r.publish(nc, r.batchSubj, b) })
}

// publishTick is the publishing half of a tick: changes plus a share of
// the anti-entropy counts, or a heartbeat when there is nothing to send.
func (r *Replicator) publishTick(now time.Time, max int, send func([]byte) error) {
	if r.publishChanges(now, max, send, true) == 0 && now.Sub(r.lastSent) >= r.cfg.Heartbeat {
		r.heartbeat(now, max, send)
	}
}

// early publishes this node's changes between ticks, because a local hit
// left a key near its limit: peers learn it within the delivery delay
// rather than at the next tick. Like tick, it publishes nothing while NATS
// is away (the changes stay marked for the first batch after).
func (r *Replicator) early(nc *nats.Conn, now time.Time) {
	if !nc.IsConnected() {
		return
	}
	n := r.publishChanges(now, r.maxOut(nc), func(b []byte) error { return r.publish(nc, r.batchSubj, b) }, false)
	r.m.earlyBatches.Add(float64(n))
}

// maxOut is the largest message this node may publish on nc, sealed.
func (r *Replicator) maxOut(nc *nats.Conn) int {
	if mp := int(nc.MaxPayload()); mp > 0 {
		return min(mp, r.cfg.MaxMessageBytes) - sealOverhead
	}
	return r.cfg.MaxMessageBytes - sealOverhead
}

// sealed returns msg sealed for kind with buf and ad as scratch, or msg
// itself without a cluster key.
func (r *Replicator) sealed(buf, ad *[]byte, msg []byte, kind msgKind) []byte {
	if r.seal == nil {
		return msg
	}
	*buf = r.seal.seal((*buf)[:0], msg, kind, ad)
	return *buf
}

// heartbeat publishes an empty batch: peers keep this node known while it
// has nothing to say.
func (r *Replicator) heartbeat(now time.Time, max int, send func([]byte) error) {
	r.publishMu.Lock()
	defer r.publishMu.Unlock()
	r.split.max = max
	r.split.emit = func(b []byte) error {
		if err := send(r.sealed(&r.sealBuf, &r.sealAD, b, kindBatch)); err != nil {
			r.m.publishErrors.Inc()
			return nil
		}
		r.m.heartbeats.Inc()
		r.lastSent = now
		return nil
	}
	r.split.start(header{Kind: kindBatch, Node: r.self.Node, Incarnation: r.self.Incarnation, SentAtMS: now.UnixMilli(), Seq: r.seq})
	r.split.flush(true)
	r.seq = r.split.msg.Seq
}

// antiEntropy appends to dst this tick's share of this node's live counts:
// every AntiEntropy a snapshot of them is taken and published again over
// the following ticks, so that a count whose batch was lost reaches the
// peers even if its key never changes again. Counts merge by max, so a
// repeated one changes nothing.
func (r *Replicator) antiEntropy(dst []counter.WindowCount, now time.Time) []counter.WindowCount {
	if r.cfg.AntiEntropy < 0 {
		return dst
	}
	if len(r.aeQueue) == 0 {
		if now.Before(r.aeNext) {
			return dst
		}
		r.aeNext = now.Add(r.cfg.AntiEntropy)
		r.aeSnap = r.store.Snapshot(r.aeSnap[:0], now)
		r.aeQueue = r.aeQueue[:0]
		for _, pc := range r.aeSnap {
			if pc.Peer == counter.Self {
				r.aeQueue = append(r.aeQueue, pc.WindowCount)
			}
		}
		clear(r.aeSnap) // drop the key strings
		if len(r.aeQueue) == 0 {
			return dst
		}
		// Spread over the ticks of one period, so the period bounds the repair.
		ticks := max(1, int(r.cfg.AntiEntropy/r.cfg.SyncInterval))
		r.aeShare = (len(r.aeQueue) + ticks - 1) / ticks
	}
	n := min(len(r.aeQueue), r.aeShare)
	sent := 0
	for _, c := range r.aeQueue[len(r.aeQueue)-n:] {
		if counter.Live(c.Algorithm, c.ScaleMS, c.Window, now) {
			dst = append(dst, c)
			sent++
		}
	}
	clear(r.aeQueue[len(r.aeQueue)-n:])
	r.aeQueue = r.aeQueue[:len(r.aeQueue)-n]
	r.m.antiEntropy.Add(float64(sent))
	return dst
}

// publishChanges publishes, with send, the counts changed since the last
// call (and those of a failed publish before, and with withAE a share of
// the anti-entropy counts), in messages of at most max bytes. It returns
// how many messages it published.
func (r *Replicator) publishChanges(now time.Time, max int, send func([]byte) error, withAE bool) (batches int) {
	r.publishMu.Lock()
	defer r.publishMu.Unlock()
	start := time.Now()
	var stale int
	r.changes, stale = r.store.Changes(r.changes[:0], now)
	if stale > 0 {
		r.m.dropped[dropStaleLocal].Add(float64(stale))
	}
	if len(r.retry) > 0 {
		for _, c := range r.retry {
			if counter.Live(c.Algorithm, c.ScaleMS, c.Window, now) {
				r.changes = append(r.changes, c)
			}
		}
		clear(r.retry)
		r.retry = r.retry[:0]
	}
	fresh := len(r.changes)
	if withAE {
		r.changes = r.antiEntropy(r.changes, now)
	}
	if len(r.changes) == 0 {
		return 0
	}
	failed := false
	sent := 0
	r.split.max = max
	r.split.emit = func(b []byte) error {
		if err := send(r.sealed(&r.sealBuf, &r.sealAD, b, kindBatch)); err != nil {
			r.m.publishErrors.Inc()
			if !failed {
				r.log.Warn("publish batch", "err", err)
			}
			failed = true
			return nil
		}
		r.m.batchesSent.Inc()
		r.lastSent = now
		batches++
		sent += len(r.split.msg.Entries)
		return nil
	}
	r.split.start(header{Kind: kindBatch, Node: r.self.Node, Incarnation: r.self.Incarnation, SentAtMS: now.UnixMilli(), Seq: r.seq})
	for _, c := range r.changes {
		if int(c.Bucket) >= len(r.cfg.Buckets) {
			r.m.dropped[dropInvalid].Inc()
			continue
		}
		l := wireLimit{Name: r.cfg.Buckets[c.Bucket], ScaleMS: c.ScaleMS, Algorithm: c.Algorithm}
		if err := r.split.add(l, origin{}, c.Window, c.Key, c.Count); errors.Is(err, errEntryTooLarge) {
			r.m.dropped[dropTooLarge].Inc()
		}
	}
	r.split.flush(false)
	r.seq = r.split.msg.Seq
	r.m.entriesSent.Add(float64(sent))
	if failed {
		// Offer everything again next time: counts are running counts, so
		// what did go out is merely repeated. (Anti-entropy counts come
		// round again anyway.)
		n := min(fresh, maxPending)
		r.retry = append(r.retry[:0], r.changes[:n]...)
	}
	clear(r.changes[fresh:]) // drop the anti-entropy key strings
	r.m.publishDuration.Observe(time.Since(start).Seconds())
	return batches
}

// guard wraps a NATS message handler: a panic in it is a bug, yet must not
// stop the node (every node runs the same handler on the same message), so
// it is recovered, counted and logged, and the message is dropped.
func (r *Replicator) guard(what string, h nats.MsgHandler) nats.MsgHandler {
	return func(msg *nats.Msg) {
		defer func() {
			if v := recover(); v != nil {
				r.m.panics.Inc()
				r.log.Error("recovered a panic in a replication handler; message dropped",
					"handler", what, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			}
		}()
		h(msg)
	}
}

// onBatch merges a peer's batch. NATS calls it for one message at a time.
func (r *Replicator) onBatch(msg *nats.Msg) {
	now := r.now()
	m := &r.rx
	if !r.read(msg.Data, m, kindBatch, &r.rxBuf, now) {
		return
	}
	p := r.peers.get(m.Node, m.Incarnation, now)
	if p == nil {
		r.m.peersRefused.Inc()
		r.m.dropped[dropUnknownPeer].Add(float64(len(m.Entries)))
		return
	}
	r.observe(p, m, now)
	r.merge(m, func(int) counter.PeerID { return p.id }, now)
	r.m.batchesReceived.Inc() // after merging: tests wait on it
}

// rxBuffers are the scratch buffers of one receiving goroutine.
type rxBuffers struct {
	plain, ad []byte
}

// read opens (with a cluster key) and decodes data into m, and checks it
// is of kind, not from this process and sent close to now; it counts and
// reports false for anything else. Nothing of a message that fails here
// is used, logged or kept.
func (r *Replicator) read(data []byte, m *message, kind msgKind, buf *rxBuffers, now time.Time) bool {
	if len(data) > r.cfg.MaxMessageBytes {
		r.m.malformed[malOversize].Inc()
		return false
	}
	if r.seal != nil {
		plain, err := r.seal.open(buf.plain[:0], data, kind, &buf.ad)
		switch {
		case err == nil:
			buf.plain, data = plain, plain
		case errors.Is(err, errUnsealed):
			r.m.malformed[malUnsealed].Inc()
			return false
		case errors.Is(err, errUnknownKey):
			r.m.malformed[malUnknown].Inc()
			return false
		case errors.Is(err, errVersion):
			r.m.malformed[malVersion].Inc()
			return false
		default:
			r.m.malformed[malAuth].Inc()
			return false
		}
	} else if isSealed(data) {
		r.m.malformed[malNoKey].Inc()
		return false
	}
	if err := decode(data, m); err != nil {
		if errors.Is(err, errVersion) {
			r.m.malformed[malVersion].Inc()
		} else {
			r.m.malformed[malDecode].Inc()
		}
		r.log.Debug("dropped a malformed message", "err", err) // %q-quoted: safe to print
		return false
	}
	if m.Kind != kind {
		r.m.malformed[malKind].Inc()
		return false
	}
	if m.Node == r.self.Node && m.Incarnation == r.self.Incarnation {
		r.m.malformed[malSelf].Inc()
		return false
	}
	if d := now.UnixMilli() - m.SentAtMS; d > r.cfg.MaxClockSkew.Milliseconds() || d < -r.cfg.MaxClockSkew.Milliseconds() {
		r.m.malformed[malClock].Inc()
		return false
	}
	return true
}

// observe updates the peer's sequence and clock-skew figures from a batch.
func (r *Replicator) observe(p *peer, m *message, now time.Time) {
	switch {
	case !p.haveSeq || m.Seq == p.lastSeq+1:
	case m.Seq > p.lastSeq:
		r.m.batchesMissed.Add(float64(min(m.Seq-p.lastSeq-1, 1<<20)))
	default:
		r.m.batchesRepeated.Inc()
	}
	if !p.haveSeq || m.Seq > p.lastSeq {
		p.lastSeq, p.haveSeq = m.Seq, true
	}
	skew := time.Duration(now.UnixMilli()-m.SentAtMS) * time.Millisecond
	p.skewMS.Store(skew.Milliseconds())
	if (skew > r.cfg.SkewWarning || skew < -r.cfg.SkewWarning) && now.Sub(p.skewLogged) >= time.Minute {
		p.skewLogged = now
		// The node id is validated printable ASCII, from an authenticated message.
		r.log.Warn("peer clock skew above the warning threshold; windows may disagree at their edges",
			"peer", p.key.node, "skew", skew.String(), "threshold", r.cfg.SkewWarning.String())
	}
}

// merge merges m's entries, each under the peer id origin gives for its
// origin index (counter.Self: skip the entry, it is this node's own).
// Entries of a bucket this node does not know, or of a window length no
// limit of the bucket has here, are dropped; counts above what a limit of
// the bucket allows are merged at that bound.
func (r *Replicator) merge(m *message, origin func(int) counter.PeerID, now time.Time) (merged int) {
	r.m.entriesReceived.Add(float64(len(m.Entries)))
	var idxBuf [16]int64
	var boundBuf [16]int64
	idx, bound := idxBuf[:0], boundBuf[:0]
	for _, l := range m.Limits {
		b, ok := r.bucketIdx[l.Name]
		if !ok {
			idx, bound = append(idx, -1), append(bound, 0)
			continue
		}
		mx := int64(counter.MaxCount)
		if r.cfg.Bounds != nil {
			var valid bool
			if mx, valid = r.cfg.Bounds.PeerBound(b, l.ScaleMS); !valid {
				idx, bound = append(idx, -2), append(bound, 0)
				continue
			}
		}
		idx, bound = append(idx, int64(b)), append(bound, mx)
	}
	for i := range m.Entries {
		e := &m.Entries[i]
		b := idx[e.Limit]
		switch b {
		case -1:
			r.m.dropped[dropUnknownBucket].Inc()
			continue
		case -2:
			r.m.dropped[dropScale].Inc()
			continue
		}
		pid := origin(e.Origin)
		if pid == counter.Self {
			continue
		}
		l := &m.Limits[e.Limit]
		count := e.Count
		if count > bound[e.Limit] {
			count = bound[e.Limit]
			r.m.clamped.Inc()
		}
		wc := counter.WindowCount{Bucket: counter.Bucket(b), Key: e.Key, ScaleMS: l.ScaleMS, Algorithm: l.Algorithm, Window: e.Window, Count: count}
		if r.mergeOne(pid, wc, now) {
			merged++
		}
	}
	return merged
}

func (r *Replicator) mergeOne(pid counter.PeerID, wc counter.WindowCount, now time.Time) bool {
	switch st := r.store.Merge(pid, wc, now); st {
	case counter.Merged:
		r.m.entriesMerged.Inc()
		return true
	case counter.Unchanged:
	case counter.Stale:
		r.m.dropped[dropStale].Inc()
	case counter.Deferred:
		r.deferMu.Lock()
		if len(r.deferred) < maxPending {
			r.deferred = append(r.deferred, deferredCount{pid, wc})
		} else {
			r.m.dropped[dropDeferred].Inc()
		}
		r.deferMu.Unlock()
	case counter.Mismatch:
		r.m.dropped[dropMismatch].Inc()
	case counter.Refused:
		r.m.dropped[dropRefused].Inc()
	default:
		r.m.dropped[dropInvalid].Inc()
	}
	return false
}

// retryDeferred offers the deferred counts again.
func (r *Replicator) retryDeferred(now time.Time) {
	r.deferMu.Lock()
	d := r.deferred
	r.deferred = nil
	r.deferMu.Unlock()
	for _, x := range d {
		r.mergeOne(x.peer, x.wc, now) // a still-deferred count is deferred again
	}
}

// redactURLs returns the comma-separated NATS URLs s with every password
// and token replaced, for logs: a URL that does not parse is replaced whole, since
// it may hold a password in a shape url.Parse does not recognise.
func redactURLs(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		u, err := url.Parse(p)
		switch {
		case err != nil:
			parts[i] = "(unparsable URL)"
		case u.User != nil:
			if _, has := u.User.Password(); !has {
				u.User = url.User("xxxxx") // a user alone may be a token
			}
			parts[i] = u.Redacted()
		default:
			parts[i] = p
		}
	}
	return strings.Join(parts, ",")
}
