package replicate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/share"
)

// Store is what the Replicator needs of the counter store; *counter.Store
// is it, created with counter.Config.Track set.
type Store interface {
	Changes(dst []counter.WindowCount, now time.Time) ([]counter.WindowCount, int)
	Merge(peer counter.PeerID, c counter.WindowCount, now time.Time) counter.MergeStatus
	LiveCounts(dst []counter.PeerCount, now time.Time) []counter.PeerCount
	Pending() int
	// NearLimit signals when a local count came near its limit, and Spent
	// whether a charge spent a key's budget: early batches.
	NearLimit() <-chan struct{}
	Spent() bool
	// SetShares splits budgets between the live nodes.
	SetShares(share.Split) error
	// Reported lists the own counts reported, for anti-entropy.
	Reported(dst []counter.WindowCount, now time.Time) []counter.WindowCount
	// MarkUnreported marks the counts that shares kept unreported, for the
	// final batch.
	MarkUnreported(min int64) int
}

var _ Store = (*counter.Store)(nil)

// Replicator shares a counter store's counts with the other nodes over
// NATS. Create it with New and run it with Run. Its methods are safe for
// concurrent use.
//
// It is made of three parts, each owning its state: the publisher (batches,
// heartbeats, anti-entropy; driven by Run's loop), the receiver (reading,
// validating and merging peers' batches, and the counts deferred to their
// window) and the syncer (warm start and resync requests, and the answers
// to peers' requests). The peer table is shared by the receiver and the
// syncer.
type Replicator struct {
	*shared
	pub    *publisher
	recv   *receiver
	syncer *syncer

	started   atomic.Bool
	ready     chan struct{}
	readyOnce sync.Once
	conn      atomic.Pointer[nats.Conn] // the connection, once Run made it
	// up is the link's state as the connection's handlers last reported
	// it, and reconnects their count: read without the NATS client's
	// lock, which a write stuck on a dead link holds until writeStall.
	up         atomic.Bool
	reconnects atomic.Uint64
	answerer   atomic.Pointer[Answerer] // nil: queries are not answered
	query      querier                  // owned by the query subscription
	probe      prober                   // owned by the echo subscription

	castHandler atomic.Pointer[CastHandler] // nil: casts are dropped
	cast        caster                      // owned by the cast subscription
	castSeq     atomic.Uint64               // the last cast's number

	// Owned by Run's loop (tick).
	lastShares   share.Split
	scratch      []member
	dupNames     map[string]bool // node ids several live processes claimed at the last tick
	dupScratch   map[string]bool
	shareNodes   atomic.Int64                // lastShares.Nodes, for the gauge
	shareDelayMS atomic.Int64                // lastShares.Delay, for the gauge
	shares       atomic.Pointer[share.Split] // lastShares, for Shares
}

// shared is what every part of a Replicator reads: set by New, never
// changed after (peers and the metrics are safe for concurrent use).
type shared struct {
	cfg       Config
	store     Store
	log       *slog.Logger
	now       func() time.Time // cfg.Now
	m         *metrics
	self      origin    // node id and this process's incarnation: its identity
	born      time.Time // when this process was created (New): first heard from, as a member
	batchSubj string
	syncSubj  string
	querySubj string
	castSubj  string
	peers     *peerTable
	seal      *sealer // nil: no cluster key
	hooks     hooks
	// tab is the configuration followed (see Prepare); a sender or
	// receiver loads it once per message.
	tab atomic.Pointer[table]
}

// hooks are test seams, fixed at construction; the zero value is the
// production behaviour.
type hooks struct {
	// send publishes one message; nil: nc.Publish.
	send func(nc *nats.Conn, subject string, data []byte) error
	// kick, if set, makes Run tick when it receives a channel, and close
	// that channel after.
	kick chan chan struct{}
	// subPending, if positive, bounds the messages a subscription holds
	// unread (else nats.go's default).
	subPending int
}

// New returns a Replicator for store, which must track changes
// (counter.Config.Track). Nothing is started until Run.
func New(cfg Config, store Store, reg prometheus.Registerer, log *slog.Logger) (*Replicator, error) {
	return newReplicator(cfg, store, reg, log, hooks{})
}

func newReplicator(cfg Config, store Store, reg prometheus.Registerer, log *slog.Logger, h hooks) (*Replicator, error) {
	if store == nil || reg == nil || log == nil {
		return nil, errors.New("replicate: New needs a store, a registerer and a logger")
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if h.send == nil {
		h.send = func(nc *nats.Conn, subj string, data []byte) error { return nc.Publish(subj, data) }
	}
	self := origin{Node: cfg.NodeID, Incarnation: rand.Uint64()}
	sh := &shared{
		cfg:       cfg,
		store:     store,
		log:       log.With("node", self.Node, "incarnation", fmt.Sprintf("%016x", self.Incarnation)),
		now:       cfg.Now,
		self:      self,
		born:      cfg.Now(),
		batchSubj: cfg.SubjectPrefix + ".batch",
		syncSubj:  cfg.SubjectPrefix + ".sync",
		querySubj: cfg.SubjectPrefix + ".query",
		castSubj:  cfg.SubjectPrefix + ".cast",
		peers:     newPeerTable(cfg.MaxPeers),
		hooks:     h,
	}
	tb, err := newTable(cfg.Buckets)
	if err != nil {
		return nil, err
	}
	sh.tab.Store(tb)
	if sh.seal, err = newSealer(cfg.Keys, cfg.SubjectPrefix); err != nil {
		return nil, err
	}
	r := &Replicator{shared: sh, ready: make(chan struct{}), dupNames: map[string]bool{}, dupScratch: map[string]bool{}}
	r.query.answers = tokenBucket{max: queryAnswersPerSecond, rate: queryAnswersPerSecond}
	probes := float64(probesPerPeer*cfg.MaxPeers) / cfg.SyncInterval.Seconds()
	r.query.probes = tokenBucket{max: probes, rate: probes}
	r.probe.epoch = time.Now()
	r.pub = newPublisher(sh)
	r.recv = newReceiver(sh)
	r.syncer = newSyncer(sh, r.recv)
	if sh.m, err = newMetrics(reg, r.gauges); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Replicator) gauges(ns, sub string) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "connected",
			Help: "1 while the link to NATS is up: connected, answering pings and taking writes (a silent cut is noticed within 4 pings); else 0 (the node then limits on its own counts).",
		}, func() float64 {
			if r.connected() {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "reconnects_total",
			Help: "Reconnections to NATS.",
		}, func() float64 { return float64(r.reconnects.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "peers",
			Help: "Peers heard from within the peer expiry.",
		}, func() float64 { return float64(r.peers.len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "clock_skew_seconds",
			Help: "Largest absolute clock skew over the known peers: for each, the least difference between receive time and send time of its batches over the last 10 to 20 heartbeats (so that batches that waited, a stall of this node, NATS or the peer, do not count), less half the least round trip of its link probes over that time (so that the delivery delay does not count either).",
		}, func() float64 { return r.peers.maxSkew().Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "share_nodes",
			Help: "Nodes each key's budget is split between: this process and the other processes heard from in the last 3 heartbeats, each a node of its own whatever its node id; 0 or 1: no split, the node admits on its own view up to the whole limit.",
		}, func() float64 { return float64(r.shareNodes.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "share_delay_seconds",
			Help: "How long after publishing a count this node waits before its share grows (its peers hold the count and have answered): the early gap plus the round trip to the slowest peer (its link probes' latest, or twice its latest batch's age less its clock skew when larger; at least 5 ms, however long), or the configured share delay when longer.",
		}, func() float64 { return float64(r.shareDelayMS.Load()) / 1000 }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "pending_entries",
			Help: "Keys with changed counts not yet published (grows while NATS is away).",
		}, func() float64 { return float64(r.pub.pending()) }),
	}
}

// connected reports whether the link to NATS is up: connected, and
// answering pings and taking writes (see connect).
func (r *Replicator) connected() bool { return r.up.Load() }

// Ready is closed once the warm start has ended: peers answered, the
// deadline passed, or NATS was not reachable at start.
func (r *Replicator) Ready() <-chan struct{} { return r.ready }

func (r *Replicator) markReady() { r.readyOnce.Do(func() { close(r.ready) }) }

// Nodes is how many live nodes split the budget shares, this one included
// (ratelimit_authz_replicate_share_nodes): 1 while NATS is away or shares
// are off. Safe for concurrent use.
func (r *Replicator) Nodes() int { return max(int(r.shareNodes.Load()), 1) }

// Shares is the split of the budgets in effect: the live nodes, this
// node's rank among them and the delay (Nodes 1 while NATS is away or
// shares are off), for a component that splits budgets of its own like
// the counter's (package inflight's slots). Safe for concurrent use.
func (r *Replicator) Shares() share.Split {
	if sh := r.shares.Load(); sh != nil {
		return *sh
	}
	return share.Split{Nodes: 1}
}

// Identity is this process's node id and incarnation. The node id is a
// name that several processes may claim (logged and counted); the pair
// is unique, and is what the cluster tells nodes apart by.
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
	nc, err := r.connect(ctx, &offline)
	if err != nil {
		return err
	}
	r.conn.Store(nc)
	defer nc.Close()
	if err := r.subscribe(nc); err != nil {
		return err
	}
	warm := nc.IsConnected()
	if !warm {
		offline.Store(true)
		r.log.Warn("NATS not reachable at start; serving on this node's counts and retrying in the background", "url", redactURLs(r.cfg.URL))
		r.markReady()
		if nc.IsConnected() { // connected just now, perhaps before the flag was set
			r.syncer.requestResync()
		}
	}
	syncDone := make(chan struct{})
	go func() {
		defer close(syncDone)
		r.syncer.run(ctx, nc, warm, r.markReady)
	}()
	inbox := nats.NewInbox()
	if _, err := nc.Subscribe(inbox, r.guard("probe echo", r.onEcho)); err != nil {
		return fmt.Errorf("replicate: subscribe to the probes' inbox: %w", err)
	}
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		r.probeLoop(ctx, nc, inbox)
	}()
	r.loop(ctx, nc)
	<-syncDone // no sync runs any more
	<-probeDone
	r.final(nc)
	return nil
}

// loop publishes at every tick, and early when the store signals a key
// near its limit, until ctx is done.
func (r *Replicator) loop(ctx context.Context, nc *nats.Conn) {
	t := time.NewTimer(untilTick(r.now(), r.cfg.SyncInterval))
	defer t.Stop()
	// Early batches: near receives when a local hit left a key near its
	// limit; one is published at once unless one went out less than
	// EarlyGap ago, in which case gapT publishes it when the gap ends. A
	// charge that spent a key's budget (spent) is published at once
	// within the gap too, at most once per gap: so at most two early
	// batches go out per EarlyGap.
	var (
		near  <-chan struct{}
		spent func() bool
	)
	if r.cfg.EarlyGap > 0 {
		near, spent = r.store.NearLimit(), r.store.Spent
	}
	gapT := time.NewTimer(time.Hour)
	gapT.Stop()
	defer gapT.Stop()
	var lastEarly, lastSpent time.Time
	gapArmed := false
	early := func() {
		lastEarly = r.now()
		r.early(nc, lastEarly)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.tick(nc, r.now())
			t.Reset(untilTick(r.now(), r.cfg.SyncInterval))
		case done := <-r.hooks.kick:
			r.tick(nc, r.now())
			close(done)
		case <-near:
			now := r.now()
			wait := r.cfg.EarlyGap - now.Sub(lastEarly)
			// Read at every signal: the note is of the counts this one
			// publishes.
			urgent := spent()
			switch {
			case urgent && wait > 0 && now.Sub(lastSpent) >= r.cfg.EarlyGap:
				lastSpent = now
				early() // an armed gap still publishes what comes after
			case gapArmed: // the gap's end publishes this one too
			case wait > 0:
				gapT.Reset(wait)
				gapArmed = true
			default:
				early()
			}
		case <-gapT.C:
			gapArmed = false
			early()
		}
	}
}

// untilTick is the time from now to the next multiple of interval since
// the Unix epoch. Like windows, ticks are aligned to the wall clock: with
// synchronised clocks every node publishes at the same instants, so at any
// moment each node knows every peer's counts as of the last tick, and a
// window of a multiple of the interval begins with a fresh view.
func untilTick(now time.Time, interval time.Duration) time.Duration {
	d := interval.Nanoseconds()
	n := now.UnixNano()
	return time.Duration((counter.WindowOf(n, d)+1)*d - n)
}

// tick is one sync interval: retry deferred counts, forget silent peers,
// drop an old sync reply, and publish this node's changes if NATS is there
// (or a heartbeat when there are none). While it is not, the changes stay
// marked in the store and go out, at their latest counts, in the first
// batch after it is back.
func (r *Replicator) tick(nc *nats.Conn, now time.Time) {
	r.recv.retryDeferred(now)
	r.peers.expire(now, r.cfg.PeerExpiry)
	r.syncer.dropReply(now)
	r.members(now, r.connected())
	if !r.connected() {
		return
	}
	r.pub.publishTick(now, r.maxOut(nc), func(b []byte) error { return r.hooks.send(nc, r.batchSubj, b) })
}

// early publishes this node's changes between ticks, because a local hit
// left a key near its limit: peers learn it within the delivery delay
// rather than at the next tick. Like tick, it publishes nothing while NATS
// is away (the changes stay marked for the first batch after).
func (r *Replicator) early(nc *nats.Conn, now time.Time) {
	if !r.connected() {
		return
	}
	n := r.pub.publishChanges(now, r.maxOut(nc), func(b []byte) error { return r.hooks.send(nc, r.batchSubj, b) }, false)
	r.m.earlyBatches.Add(float64(n))
}

// final publishes what changed since the last batch, at shutdown.
func (r *Replicator) final(nc *nats.Conn) {
	if r.cfg.ShareDelay >= 0 {
		r.store.MarkUnreported(2)
	}
	r.tick(nc, r.now())
	if !r.connected() {
		return
	}
	if err := nc.FlushTimeout(r.cfg.FlushTimeout); err != nil {
		r.log.Warn("final batch not confirmed by NATS", "err", err, "timeout", r.cfg.FlushTimeout.String())
		return
	}
	r.log.Info("final batch published")
}

// maxOut is the largest message this node may publish on nc, sealed.
func (s *shared) maxOut(nc *nats.Conn) int {
	if mp := int(nc.MaxPayload()); mp > 0 {
		return min(mp, s.cfg.MaxMessageBytes) - sealOverhead
	}
	return s.cfg.MaxMessageBytes - sealOverhead
}

// sealed returns msg sealed for kind with buf and ad as scratch, or msg
// itself without a cluster key.
func (s *shared) sealed(buf, ad *[]byte, msg []byte, kind msgKind) []byte {
	if s.seal == nil {
		return msg
	}
	*buf = s.seal.seal((*buf)[:0], msg, kind, ad)
	return *buf
}

// guard wraps a NATS message handler: a panic in it is a bug, yet must not
// stop the node (every node runs the same handler on the same message), so
// it is recovered, counted and logged, and the message is dropped.
func (s *shared) guard(what string, h nats.MsgHandler) nats.MsgHandler {
	return func(msg *nats.Msg) {
		defer func() {
			if v := recover(); v != nil {
				s.m.panics.Inc()
				s.log.Error("recovered a panic in a replication handler; message dropped",
					"handler", what, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			}
		}()
		h(msg)
	}
}

// shareLive is how recently, in heartbeats, a peer must have been heard
// from to take a share of the budgets: a peer that stopped is dropped
// from the split within a few seconds, so the others' shares grow back.
const shareLive = 3

// shareDelay is how long after publishing a count the node takes its
// peers to hold it and their answers to have arrived (see share.Delay).
func (r *Replicator) shareDelay() time.Duration {
	return min(share.Delay(r.cfg.ShareDelay, r.cfg.EarlyGap, r.peers.roundTrip(&r.probe, time.Now(), r.now().Add(-shareLive*r.cfg.Heartbeat), r.now().Add(-r.cfg.Heartbeat), r.cfg.SyncInterval), r.cfg.SyncInterval), counter.MaxShareDelay)
}

// members takes stock of the live processes at a tick: duplicate node ids,
// and the budget shares.
func (r *Replicator) members(now time.Time, connected bool) {
	live := r.live(now)
	r.noteDuplicates(live)
	r.setShares(live, connected)
}

// live returns the live processes of the cluster, this one included,
// sorted by identity (so every node ranks them alike): the peers heard
// from in the last shareLive heartbeats, whatever their node ids. A
// restarted process is two for that long, its previous incarnation
// taking a share it no longer spends: the cluster admits less, never
// more.
func (r *Replicator) live(now time.Time) []member {
	ms := r.peers.live(r.scratch[:0], now.Add(-shareLive*r.cfg.Heartbeat))
	ms = append(ms, member{id: r.self, first: r.born, last: now})
	slices.SortFunc(ms, func(a, b member) int {
		return cmp.Or(strings.Compare(a.id.Node, b.id.Node), cmp.Compare(a.id.Incarnation, b.id.Incarnation))
	})
	r.scratch = ms[:0]
	return ms
}

// noteDuplicates logs and counts, once per episode, each node id that
// several live processes claim at once (two started with one --node-id,
// or without one on one host): processes of one name each heard from
// while the other was (a restart is not: the old process was last heard
// from before the new one first was). It changes nothing else: each
// process is a node of its own in the shares, peers and sync replies,
// whatever its name.
func (r *Replicator) noteDuplicates(live []member) {
	cur := r.dupScratch
	clear(cur)
	for i := 0; i < len(live); {
		j := i + 1
		for j < len(live) && live[j].id.Node == live[i].id.Node {
			j++
		}
		group := live[i:j]
		if slices.ContainsFunc(group, func(m member) bool { return overlaps(group, m) }) {
			name := live[i].id.Node
			cur[name] = true
			if !r.dupNames[name] {
				r.m.duplicateNodeIDs.Inc()
				var ids []string
				for _, m := range group {
					if overlaps(group, m) {
						ids = append(ids, m.id.String())
					}
				}
				// Node ids are validated printable ASCII, from authenticated messages.
				r.log.Warn("several live processes claim one node id; each still counts as a node of its own, but logs name them alike: give each its own node id",
					"node_id", name, "processes", strings.Join(ids, ","))
			}
		}
		i = j
	}
	r.dupNames, r.dupScratch = cur, r.dupNames
}

// overlaps reports whether another process of ms (one node id) was heard
// from while m was.
func overlaps(ms []member, m member) bool {
	for _, o := range ms {
		if o.id != m.id && !m.first.After(o.last) && !o.first.After(m.last) {
			return true
		}
	}
	return false
}

// setShares tells the store how many nodes split the budgets and this
// node's rank among them: the live processes while connected, none (each
// node on its own, up to the whole limit) while NATS is away.
func (r *Replicator) setShares(live []member, connected bool) {
	if r.cfg.ShareDelay < 0 {
		return
	}
	sh := share.Split{Nodes: 1}
	if connected {
		rank := 0
		for i, m := range live {
			if m.id == r.self {
				rank = i
			}
		}
		sh = share.Split{Nodes: len(live), Rank: rank, Delay: r.shareDelay()}
	}
	if sh != r.lastShares {
		if err := r.store.SetShares(sh); err != nil {
			r.log.Error("setting budget shares", "err", err)
			return
		}
		r.lastShares = sh
		r.shareNodes.Store(int64(sh.Nodes))
		r.shareDelayMS.Store(sh.Delay.Milliseconds())
		r.shares.Store(&sh)
	}
}
