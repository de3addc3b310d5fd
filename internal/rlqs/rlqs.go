package rlqs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/share"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// Counter counts usage per (bucket, key) in windows. *counter.Store is one.
type Counter interface {
	Incr(bucket counter.Bucket, key string, lim counter.Limit, n int64, now time.Time) counter.Result
	Peek(bucket counter.Bucket, key string, lim counter.Limit, now time.Time) counter.Result
}

var _ Counter = (*counter.Store)(nil)

// Config is one configuration the Service serves.
type Config struct {
	// Quota is the quota section of the rules file. Required.
	Quota *configfile.Quota
	// Buckets are a snapshot's buckets (snapshot.Snapshot.Buckets): the
	// rules file's first, by index, as the quota section names them. A
	// bucket's Participants is the index here of its participants count
	// (see ParticipantsWindow), replicated with the other counts so that
	// every node knows the cluster's participants; -1: none, and a node
	// splits over its own participants only.
	Buckets []snapshot.Bucket
	// Resolver resolves the buckets' limits, by the same index.
	Resolver *snapshot.Resolver
}

func (c Config) validate() error {
	if c.Quota == nil {
		return errors.New("rlqs: no quota section")
	}
	if c.Resolver == nil {
		return errors.New("rlqs: no limits")
	}
	for i, e := range c.Quota.Buckets {
		if e.Bucket < 0 || e.Bucket >= len(c.Buckets) {
			return fmt.Errorf("rlqs: quota.buckets[%d] names bucket %d of %d", i, e.Bucket, len(c.Buckets))
		}
	}
	if c.Quota.MaxStreams <= 0 || c.Quota.MaxBucketIDs <= 0 || c.Quota.AssignmentTTL <= 0 || c.Quota.AbandonAfter <= 0 {
		return errors.New("rlqs: the quota section's bounds and durations must be positive")
	}
	return nil
}

// Options are the Service's settings that are not configuration.
type Options struct {
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Tick is how often each stream looks at its buckets between reports
	// (a window that rolled over, a budget spent on other nodes, an
	// assignment to refresh, a bucket to abandon); default 100 ms.
	Tick time.Duration
	// Nodes is how many live nodes the cluster has, this one included;
	// nil: one. Until the cluster's participants of a (bucket, key) are
	// known (see Settle), each live node counts as one, so that nodes whose
	// participants join at once do not each hand out the whole budget.
	Nodes func() int
	// Settle is how long after a (bucket, key) gets its first participant
	// on this node the replicated participants count is taken to hold the
	// other nodes' participants that joined with it: a replication round
	// trip. Default DefaultSettle.
	Settle time.Duration
	// Overrides are the tenant overrides Prepare resolves a snapshot's
	// limits over; nil: the configured limits only.
	Overrides limits.Overrides
}

// DefaultTick is Options.Tick's default.
const DefaultTick = 100 * time.Millisecond

// DefaultSettle is Options.Settle's default: two replication intervals.
const DefaultSettle = 200 * time.Millisecond

// Service serves StreamRateLimitQuotas. Create it with New; it is safe
// for concurrent use.
type Service struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer

	counter Counter
	log     *slog.Logger
	opts    Options
	m       *metrics
	reg     *registry

	cur        atomic.Pointer[state]
	streams    atomic.Int64
	nextStream atomic.Uint64

	done      chan struct{}
	closeOnce sync.Once
}

// state is one configuration in force, immutable.
type state struct {
	cfg     Config
	mapping *Mapping
	domains map[string]bool
}

func newState(cfg Config) (*state, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	st := &state{cfg: cfg, mapping: NewMapping(cfg.Quota.Buckets), domains: map[string]bool{}}
	for _, d := range cfg.Quota.Domains {
		st.domains[d] = true
	}
	return st, nil
}

// New returns a Service serving cfg.
func New(cfg Config, c Counter, reg prometheus.Registerer, log *slog.Logger, opts Options) (*Service, error) {
	if c == nil || log == nil || reg == nil {
		return nil, errors.New("rlqs: New needs a counter, a registry and a logger")
	}
	st, err := newState(cfg)
	if err != nil {
		return nil, err
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Tick < 0 || opts.Settle < 0 {
		return nil, fmt.Errorf("rlqs: tick %v and settle %v must not be negative", opts.Tick, opts.Settle)
	}
	if opts.Tick == 0 {
		opts.Tick = DefaultTick
	}
	if opts.Settle == 0 {
		opts.Settle = DefaultSettle
	}
	if opts.Nodes == nil {
		opts.Nodes = func() int { return 1 }
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	s := &Service{counter: c, log: log, opts: opts, m: m, reg: newRegistry(), done: make(chan struct{})}
	s.cur.Store(st)
	return s, nil
}

// Prepare validates snap's quota section, its limits resolved over
// Options.Overrides, and returns what makes it the configuration of the
// next report; it changes nothing itself. Open streams move to it at
// their next report or tick: a bucket id whose mapping went away is
// abandoned, one that maps elsewhere counts there from then on.
func (s *Service) Prepare(snap *snapshot.Snapshot) (swap func(), err error) {
	st, err := newState(ConfigFrom(snap, snapshot.NewResolver(snap, s.opts.Overrides)))
	if err != nil {
		return nil, err
	}
	return func() { s.cur.Store(st) }, nil
}

// ConfigFrom is RLQS's part of snap, its limits resolved by lim: the
// quota section and the snapshot's buckets.
func ConfigFrom(snap *snapshot.Snapshot, lim *snapshot.Resolver) Config {
	return Config{Quota: snap.Rules.Quota, Buckets: snap.Buckets, Resolver: lim}
}

// SweepInterval is how often Run reclaims the idle groups.
const SweepInterval = 10 * time.Second

// Run reclaims what streams that ended left behind, until ctx ends; then
// it returns nil. Open streams go on being served: CloseStreams ends them.
func (s *Service) Run(ctx context.Context) error {
	t := time.NewTicker(SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.reg.sweep(s.opts.Now().UnixMilli())
		}
	}
}

// CloseStreams ends every open stream (codes.Unavailable) and refuses new
// ones: the step of a shutdown after the drain delay and before the
// graceful stop, which would wait for streams that never end by
// themselves. Envoy keeps its assignments and opens a stream to another
// node at its next report. It is idempotent.
func (s *Service) CloseStreams() { s.closeOnce.Do(func() { close(s.done) }) }

// action is what a bucket id is told. budget: a share of a bucket's
// budget (token bucket, or DENY_ALL with nothing left) in window window
// of scaleMS; otherwise a blanket rule from a policy. refill: the token
// bucket refills its tokens once a window (see encode), for a participant
// that spends less than its share. bounded: the share counted every live
// node as a participant (see Options.Nodes); it travels with the share, so
// that a refresh of a sent share says what that share counted.
type action struct {
	strat   strategy
	tokens  uint32
	budget  bool
	refill  bool
	bounded bool
	window  int64
	scaleMS int64
}

// tracked is one bucket id of one stream: a participant of its (bucket,
// key) when matched.
type tracked struct {
	stream, seq uint64
	id          *rlqspb.BucketId
	gen         *state
	matched     bool
	m           Match
	gk          groupKey
	joined      bool
	lastReport  time.Time
	// calm: its latest report (with a span) showed no request denied and
	// no more requests than its share over the span.
	calm    bool
	sent    action
	sentAt  time.Time
	hasSent bool
}

// stream is the state of one StreamRateLimitQuotas call, owned by its
// goroutine.
type stream struct {
	s      *Service
	id     uint64
	seq    uint64
	domain string
	ids    map[string]*tracked
}

// StreamRateLimitQuotas serves one Envoy's stream: every report's usage is
// counted, and each bucket id reported is assigned its share.
func (s *Service) StreamRateLimitQuotas(srv grpc.BidiStreamingServer[rlqspb.RateLimitQuotaUsageReports, rlqspb.RateLimitQuotaResponse]) error {
	st := s.cur.Load()
	if n := s.streams.Add(1); n > int64(st.cfg.Quota.MaxStreams) {
		s.streams.Add(-1)
		s.m.bounds[boundStreams].Inc()
		return status.Errorf(codes.ResourceExhausted, "rlqs: %d streams open already (quota.max_streams)", st.cfg.Quota.MaxStreams)
	}
	s.m.streams.Inc()
	str := &stream{s: s, id: s.nextStream.Add(1), ids: map[string]*tracked{}}
	defer func() {
		str.release()
		s.m.streams.Dec()
		s.streams.Add(-1)
	}()

	ctx := srv.Context()
	reports := make(chan *rlqspb.RateLimitQuotaUsageReports)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := srv.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reports <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	tick := time.NewTicker(s.opts.Tick)
	defer tick.Stop()
	for {
		var resp *rlqspb.RateLimitQuotaResponse
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return status.Error(codes.Unavailable, "rlqs: the server is shutting down")
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case m := <-reports:
			var err error
			if resp, err = str.report(m, s.opts.Now()); err != nil {
				return err
			}
		case <-tick.C:
			resp = str.tick(s.opts.Now())
		}
		if resp != nil && len(resp.BucketAction) > 0 {
			if err := srv.Send(resp); err != nil {
				return err
			}
		}
	}
}

// release ends the stream's participation in every group.
func (str *stream) release() {
	for k, t := range str.ids {
		str.forget(k, t)
	}
}

func (str *stream) forget(k string, t *tracked) {
	if t.joined {
		str.s.reg.leave(t.gk, t)
		t.joined = false
	}
	delete(str.ids, k)
	str.s.m.bucketIDs.Dec()
}

// report handles one usage report message.
func (str *stream) report(m *rlqspb.RateLimitQuotaUsageReports, now time.Time) (*rlqspb.RateLimitQuotaResponse, error) {
	s := str.s
	s.m.reports.Inc()
	st := s.cur.Load()
	if err := str.checkDomain(st, m.GetDomain()); err != nil {
		return nil, err
	}
	resp := &rlqspb.RateLimitQuotaResponse{}
	for _, u := range m.GetBucketQuotaUsages() {
		resp.BucketAction = str.reportUsage(resp.BucketAction, st, u, now)
	}
	return resp, nil
}

// checkDomain checks d, a report's domain, against the stream's: the
// first report names it, later ones name it or none, and st must serve
// it.
func (str *stream) checkDomain(st *state, d string) error {
	s := str.s
	switch {
	case str.domain == "" && d == "":
		return status.Error(codes.InvalidArgument, "rlqs: the first report names no domain")
	case str.domain == "":
		if !st.domains[d] {
			s.m.bounds[boundDomain].Inc()
			return status.Errorf(codes.InvalidArgument, "rlqs: domain %q is not served (quota.domains)", clip(d))
		}
		str.domain = d
	case d != "" && d != str.domain:
		return status.Errorf(codes.InvalidArgument, "rlqs: domain %q after %q on one stream: open another stream", clip(d), str.domain)
	case !st.domains[str.domain]:
		s.m.bounds[boundDomain].Inc()
		return status.Errorf(codes.FailedPrecondition, "rlqs: domain %q is no longer served (quota.domains)", str.domain)
	}
	return nil
}

// reportUsage handles one bucket id's usage in a report, appending to
// out the action it sends, if any.
func (str *stream) reportUsage(out []*rlqspb.RateLimitQuotaResponse_BucketAction, st *state, u *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage, now time.Time) []*rlqspb.RateLimitQuotaResponse_BucketAction {
	s := str.s
	s.m.requests[1].Add(float64(u.GetNumRequestsAllowed()))
	s.m.requests[0].Add(float64(u.GetNumRequestsDenied()))
	id := u.GetBucketId().GetBucket()
	allowed := int64(min(u.GetNumRequestsAllowed(), math.MaxInt32))
	denied := int64(min(u.GetNumRequestsDenied(), math.MaxInt32))
	if idProblem(id) != "" {
		// Hostile or broken: refused, and told so, without keeping it.
		s.m.bounds[boundIDSize].Inc()
		s.m.results[resInvalid].Inc()
		if len(id) > 0 {
			out = append(out, st.encode(u.GetBucketId(), action{strat: stratDenyAll}, s.m))
		}
		return out
	}
	t := str.track(st, u)
	if t == nil {
		s.m.bounds[boundBucketIDs].Inc()
		s.m.results[resUntracked].Inc()
		return append(out, st.encode(u.GetBucketId(), str.untracked(st, id, allowed, now), s.m))
	}
	// The span the usage was spent over: since this stream's previous
	// report of the id, or, for an id new on the stream (Envoy
	// reconnected and reports every bucket again), what Envoy says
	// (whole seconds; 0 for a bucket's first report), within bounds.
	span := min(max(u.GetTimeElapsed().AsDuration(), 0), st.cfg.Quota.AbandonAfter)
	if !t.lastReport.IsZero() {
		span = now.Sub(t.lastReport)
	}
	t.lastReport = now
	a, exact := str.evaluate(t, usage{allowed, denied, span}, now, true)
	if !exact && a.strat == stratTokenBucket && t.sent.strat == stratTokenBucket && t.sent.window == a.window && a.tokens >= t.sent.tokens && !t.sent.bounded {
		// Not all of the window's usage is counted (part of it was
		// guessed, or other participants have some unreported): a
		// larger share could not be handed out safely, and Envoy
		// would not add it to the tokens left anyway. A smaller one
		// is sent: it caps what is left. Whether it refills follows
		// the report. A share that counted every node, its group's
		// count now known, does grow, in a plain replacement: Envoy
		// 1.40 scales the tokens left by the new max_tokens over the
		// old, so what the participant spent and what it has left
		// add up to at most the new share.
		a.tokens, a.bounded = t.sent.tokens, t.sent.bounded
	}
	// The first budget of a window goes out full, as a tick would send
	// it, whichever comes first: a report early in a window, before the
	// tick, must not replace the previous window's spent bucket.
	fresh := exact || (a.budget && t.sent.budget && a.window != t.sent.window)
	if !t.hasSent || a != t.sent || now.Sub(t.sentAt) >= st.cfg.Quota.AssignmentTTL/2 {
		out = str.send(out, t, a, now, st, fresh)
	}
	return out
}

// track returns the stream's state of u's bucket id, tracking it if new,
// resolved under st; nil when the stream tracks as many ids as it may.
func (str *stream) track(st *state, u *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage) *tracked {
	k := idKey(u.GetBucketId().GetBucket())
	t := str.ids[k]
	if t == nil {
		if len(str.ids) >= st.cfg.Quota.MaxBucketIDs {
			return nil
		}
		str.seq++
		t = &tracked{stream: str.id, seq: str.seq, id: u.GetBucketId()}
		str.ids[k] = t
		str.s.m.bucketIDs.Inc()
	}
	if t.gen != st {
		str.resolve(t, st)
	}
	return t
}

// tick looks at every bucket id of the stream between reports. It sends
// only what cannot wait for the next report without harm: DENY_ALL when
// the budget ran out (other nodes spent it), the budget of a window that
// began, the refresh of an assignment before its TTL ends, abandon_action.
// A new share within a window waits for a report, since one sent now would
// give Envoy a full token bucket on top of usage not yet reported.
func (str *stream) tick(now time.Time) *rlqspb.RateLimitQuotaResponse {
	s := str.s
	st := s.cur.Load()
	q := st.cfg.Quota
	resp := &rlqspb.RateLimitQuotaResponse{}
	for k, t := range str.ids {
		if now.Sub(t.lastReport) >= q.AbandonAfter {
			resp.BucketAction = append(resp.BucketAction, str.abandon(k, t))
			continue
		}
		if t.gen != st {
			wasMatched := t.matched
			if str.resolve(t, st); wasMatched && !t.matched {
				// The reload removed its mapping.
				resp.BucketAction = append(resp.BucketAction, str.abandon(k, t))
				continue
			}
			// Mapped elsewhere or newly mapped: its next report decides.
		}
		if str.unchanged(t, now, q.AssignmentTTL/2) {
			continue
		}
		a, _ := str.evaluate(t, usage{}, now, false)
		fresh := false
		switch {
		case a.budget && a.strat == stratDenyAll && t.sent.strat != stratDenyAll:
		case a.budget && t.sent.budget && a.window != t.sent.window:
			fresh = true // the window's budget, in a full bucket
		case now.Sub(t.sentAt) >= q.AssignmentTTL/2:
			a = t.sent // unchanged: Envoy extends it, keeps its tokens
		default:
			continue
		}
		resp.BucketAction = str.send(resp.BucketAction, t, a, now, st, fresh)
	}
	return resp
}

// unchanged reports, at the cost of one counter lookup, that t's token
// bucket stands: same window, budget left, no refresh due. Most ticks of
// most bucket ids end here.
func (str *stream) unchanged(t *tracked, now time.Time, refresh time.Duration) bool {
	if !t.matched || t.m.Key == "" || t.sent.strat != stratTokenBucket || !t.sent.budget || now.Sub(t.sentAt) >= refresh {
		return false
	}
	b := &t.gen.cfg.Buckets[t.m.Bucket]
	lim, ok := t.gen.cfg.Resolver.Limit(t.m.Bucket, t.m.Key)
	if !ok {
		return false
	}
	r := str.s.counter.Peek(b.ID, t.m.Key, lim, now)
	return !r.Overflow && r.Window == t.sent.window && r.Remaining >= t.m.Cost
}

func (str *stream) abandon(k string, t *tracked) *rlqspb.RateLimitQuotaResponse_BucketAction {
	str.s.m.assignments[stratAbandon].Inc()
	id := t.id
	str.forget(k, t)
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{
			AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{},
		},
	}
}

// resolve maps t under st, moving it between groups as needed.
func (str *stream) resolve(t *tracked, st *state) {
	m, ok := st.mapping.Lookup(t.id.GetBucket())
	var gk groupKey
	if ok {
		gk = groupKey{bucket: st.cfg.Buckets[m.Bucket].ID, key: m.Key}
	}
	join := ok && m.Key != ""
	if t.joined && (!join || gk != t.gk) {
		str.s.reg.leave(t.gk, t)
		t.joined = false
	}
	if join && !t.joined {
		str.s.reg.join(gk, t)
		t.joined = true
	}
	t.gen, t.matched, t.m, t.gk = st, ok, m, gk
}

// usage is what one report said of a bucket id: requests allowed and
// denied over span, the time since the id's previous report (0: none).
type usage struct {
	allowed, denied int64
	span            time.Duration
}

// evaluate counts reported usage u of t (when fromReport; the part of it
// in the current window, see attributed) and decides what t is assigned.
// exact is true when all of the window's usage is counted and t is its
// only participant: then a full bucket of its share is safe mid-window.
func (str *stream) evaluate(t *tracked, u usage, now time.Time, fromReport bool) (a action, exact bool) {
	s := str.s
	st := t.gen
	res := func(r result) {
		if fromReport {
			s.m.results[r].Inc()
		}
	}
	if !t.matched {
		res(resUnmatched)
		return policy(st.cfg.Quota.Unmatched == configfile.Deny), true
	}
	b := &st.cfg.Buckets[t.m.Bucket]
	if t.m.Key == "" {
		res(resMissingKey)
		return policy(b.DenyMissingKey), true
	}
	lim, ok := st.cfg.Resolver.Limit(t.m.Bucket, t.m.Key)
	if !ok {
		res(resCounted)
		return action{strat: stratAllowAll}, true
	}
	// Counts are in the bucket's unit, Cost a request; tokens and reports
	// are Envoy's, in requests. allowed ≤ MaxInt32 and Cost ≤ MaxLimit:
	// the product fits.
	cost := t.m.Cost
	var r counter.Result
	if n := attributed(u.allowed, u.span, now, lim.ScaleMS); n > 0 {
		r = s.counter.Incr(b.ID, t.m.Key, lim, n*cost, now)
	} else {
		r = s.counter.Peek(b.ID, t.m.Key, lim, now)
	}
	if r.Overflow {
		res(resOverflow)
		return policy(b.DenyOverflow), true
	}
	res(resCounted)
	pw := now.UnixMilli() / ParticipantsLimit.ScaleMS
	rank, local, announce := s.reg.place(t.gk, t, pw, now.UnixMilli())
	n, bounded := local, false
	if b.Participants != nil {
		pid := b.Participants.ID
		var pr counter.Result
		if announce > 0 {
			pr = s.counter.Incr(pid, t.m.Key, ParticipantsLimit, announce, now)
		} else {
			pr = s.counter.Peek(pid, t.m.Key, ParticipantsLimit, now)
		}
		if !pr.Overflow {
			n, bounded = s.reg.participants(t.gk, pw, pr.Count, local, now.UnixMilli(), s.opts.Settle.Milliseconds(), s.opts.Nodes())
		}
	}
	if b.Shadow {
		return action{strat: stratAllowAll}, true
	}
	// A full bucket mid-window is safe only when this participant is the
	// only one (others' unreported usage is not counted yet) and all of
	// the window's usage is counted.
	exact = n == 1 && (u.span <= 0 || u.span.Milliseconds() <= now.UnixMilli()%lim.ScaleMS)
	tokens := share.Participant(r.Remaining, n, local, rank) / cost
	if tokens <= 0 {
		return action{strat: stratDenyAll, budget: true, bounded: bounded, window: r.Window, scaleMS: lim.ScaleMS}, exact
	}
	if fromReport {
		// Its demand over the span against its share of a whole window's
		// budget (not of what remains of this one, which late in a window
		// is about what a calm participant spends): within it, a refill
		// once a window only keeps it admitted should the server go away,
		// since it would not spend more than the share anyway.
		spanMS := u.span.Milliseconds()
		perWindow := share.Participant(lim.Limit, n, local, rank)
		t.calm = spanMS > 0 && u.denied == 0 && float64(u.allowed)*float64(cost)*float64(lim.ScaleMS) <= float64(perWindow)*float64(spanMS)
	}
	return action{strat: stratTokenBucket, tokens: uint32(min(tokens, math.MaxUint32)), budget: true, refill: t.calm, bounded: bounded, window: r.Window, scaleMS: lim.ScaleMS}, exact
}

// untracked is the answer to a bucket id over quota.max_bucket_ids: its
// usage is counted, and it is told what a key the counter cannot track is
// told (the bucket's on_overflow), or unmatched's policy.
func (str *stream) untracked(st *state, id map[string]string, reported int64, now time.Time) action {
	m, ok := st.mapping.Lookup(id)
	if !ok {
		return policy(st.cfg.Quota.Unmatched == configfile.Deny)
	}
	b := &st.cfg.Buckets[m.Bucket]
	if m.Key == "" {
		return policy(b.DenyMissingKey)
	}
	if lim, ok := st.cfg.Resolver.Limit(m.Bucket, m.Key); ok && reported > 0 {
		str.s.counter.Incr(b.ID, m.Key, lim, reported*m.Cost, now)
	}
	return policy(b.DenyOverflow)
}

func policy(deny bool) action {
	if deny {
		return action{strat: stratDenyAll}
	}
	return action{strat: stratAllowAll}
}

// send appends a for t to actions. fresh asks for a full token bucket:
// Envoy 1.40 keeps a token bucket's tokens when a different one replaces
// it (only the cap and the rate change), and starts one full only when it
// is the bucket id's first assignment or follows a blanket rule; so a
// fresh one replacing a token bucket is preceded, in the same message, by
// ALLOW_ALL for the id (Envoy applies a message's actions in order before
// any request sees them). A replacement that is not fresh keeps at most
// the tokens Envoy has left: it never adds to them. A bucket that refills
// once a window is never restarted: its refill gives each window's share,
// and a full bucket on top would let a participant whose demand rises
// spend two shares in every window until its next report.
func (str *stream) send(actions []*rlqspb.RateLimitQuotaResponse_BucketAction, t *tracked, a action, now time.Time, st *state, fresh bool) []*rlqspb.RateLimitQuotaResponse_BucketAction {
	if fresh && a.strat == stratTokenBucket && !a.refill && t.hasSent && t.sent.strat == stratTokenBucket {
		actions = append(actions, st.encodeRestart(t.id, str.s.m))
	}
	t.sent, t.sentAt, t.hasSent = a, now, true
	return append(actions, st.encode(t.id, a, str.s.m))
}

// Token bucket encoding. Envoy refills a token bucket continuously at
// tokens_per_fill / fill_interval (whole seconds), up to max_tokens, and
// keeps enforcing the last one it got until assignment_time_to_live ends,
// whether or not the server is still there. The share is max_tokens: it
// lasts to the end of its window, when the next window's fresh bucket
// takes over (see send). The refill is
//   - one share per window (tokens_per_fill / fill_interval = share /
//     window) for a calm participant, one whose latest report showed it
//     spending less than its share and nothing denied: while the server
//     is up the refill changes nothing for it (it does not spend its
//     share), and should the server go away Envoy goes on admitting about
//     a share a window until the TTL instead of spending what was left of
//     one share and then denying everything. Such a bucket is not
//     restarted at each window (see send): should the participant's
//     demand rise, a window admits at most the share it held and one
//     share of refill, and the windows after it one share each, until a
//     report shows it spending its share;
//   - otherwise negligible (one token an hour), since a participant that
//     spends its share would spend the refill on top of it, and a window
//     would admit up to twice its budget.
//
// Envoy 1.40 takes two token buckets with the same max_tokens and
// tokens_per_fill for the same one whatever their fill_interval seconds
// (it compares only the nanoseconds), so a refill never has
// tokens_per_fill 1, the negligible refill's.
const slowFill = time.Hour

// refillEvery is the fill_interval and tokens_per_fill that refill tokens
// (at least 1) a window of scaleMS.
func refillEvery(tokens uint32, scaleMS int64) (every time.Duration, perFill uint32) {
	sec := max((scaleMS+999)/1000, 1) // whole seconds, at least the window
	n := int64(tokens) + int64(tokens)*(sec*1000-scaleMS)/scaleMS
	if n < 2 {
		sec, n = 2*sec, 2*n
	}
	return time.Duration(sec) * time.Second, uint32(min(n, math.MaxUint32))
}

// encodeRestart is the ALLOW_ALL that makes the token bucket after it in
// the same message start full. Its TTL is the shortest Envoy reads, in
// case the message were ever cut after it.
func (st *state) encodeRestart(id *rlqspb.BucketId, m *metrics) *rlqspb.RateLimitQuotaResponse_BucketAction {
	m.assignments[stratAllowAll].Inc()
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(time.Second),
				RateLimitStrategy:    &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}},
			},
		},
	}
}

// encode builds the action for id.
func (st *state) encode(id *rlqspb.BucketId, a action, m *metrics) *rlqspb.RateLimitQuotaResponse_BucketAction {
	m.assignments[a.strat].Inc()
	var rs *typev3.RateLimitStrategy
	switch a.strat {
	case stratTokenBucket:
		every, perFill := slowFill, uint32(1)
		if a.refill {
			every, perFill = refillEvery(a.tokens, a.scaleMS)
		}
		rs = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens:     a.tokens,
			TokensPerFill: wrapperspb.UInt32(perFill),
			FillInterval:  durationpb.New(every),
		}}}
	case stratDenyAll:
		rs = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	default:
		rs = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}}
	}
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(st.cfg.Quota.AssignmentTTL),
				RateLimitStrategy:    rs,
			},
		},
	}
}

// clip bounds a client-supplied string quoted in an error.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Streams is the number of streams open.
func (s *Service) Streams() int { return int(s.streams.Load()) }

// Participants is the number of this node's participants of (bucket, key)
// (bucket: the counter id).
func (s *Service) Participants(bucket counter.Bucket, key string) int {
	s.reg.mu.Lock()
	defer s.reg.mu.Unlock()
	if g := s.reg.groups[groupKey{bucket, key}]; g != nil {
		return len(g.members)
	}
	return 0
}
