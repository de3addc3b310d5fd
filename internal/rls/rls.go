package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkgrpc"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/inflight"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// Limiter counts hits per (bucket, key) in windows. *counter.Store is one.
// No method may keep key after it returns: the service passes a view of a
// buffer it reuses (the store copies the keys it keeps). Incr counts the
// hits of a charged rule, whether or not they fit.
type Limiter interface {
	TakeN(bucket counter.Bucket, key string, lim counter.Limit, n int64, now time.Time) counter.Result
	Incr(bucket counter.Bucket, key string, lim counter.Limit, n int64, now time.Time) counter.Result
	Peek(bucket counter.Bucket, key string, lim counter.Limit, now time.Time) counter.Result
}

var _ Limiter = (*counter.Store)(nil)

// Leases holds the leases of concurrency rules; *inflight.Sync is one.
// Acquire takes a lease of (bucket, key) for a request id; Release frees
// that one lease, here or, held by a peer, there. Neither may keep key
// or requestID after it returns (views of buffers the service reuses).
type Leases interface {
	Acquire(bucket counter.Bucket, key, requestID string, limit int64, ttl time.Duration, now time.Time) inflight.Result
	Release(bucket counter.Bucket, key, requestID string) bool
}

var _ Leases = (*inflight.Sync)(nil)

// Overrides are the tenant overrides of overridable rules, by the rule's
// bucket id and the tenant; the overrides cache is one. OverrideFor is
// called on the ShouldRateLimit path: it must answer from memory. ok
// false: no override, and the rule's own limit applies.
type Overrides interface {
	OverrideFor(bucket counter.Bucket, tenant string) (counter.Limit, bool)
}

// Config is what the Service serves: a snapshot's RLS rules and the
// buckets of its descriptor-supplied limits, each counted under its
// bucket's id (Snapshot.RLSRules, Snapshot.RLSLimits), and the global
// settings.
type Config struct {
	Snapshot *snapshot.Snapshot
	Settings Settings
}

// Service answers Envoy's ShouldRateLimit calls. Create it with New.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	limiter Limiter
	over    Overrides // nil: none
	log     *slog.Logger
	opts    Options
	m       *metrics

	mu  sync.Mutex // serialises the swaps of New and Prepare
	cur atomic.Pointer[state]

	// keys holds *[]byte buffers the counter keys of a call are built in.
	keys sync.Pool
	// replies holds the *reply of lean calls (AppendShouldRateLimit).
	replies sync.Pool
	// holds holds the *leaseHold of calls that acquired leases.
	holds sync.Pool
	dec   *checkwire.RateLimitDecoder

	// Immutable statuses shared by every response.
	statusOK, statusUnlimited *rlsv3.RateLimitResponse_DescriptorStatus
	errDomain, errDescriptors error
}

// state is one configuration in force, immutable once built.
type state struct {
	cfg         *rlsconfig.Config
	settings    Settings
	rules       []ruleState  // by rule index
	limits      []limitState // by LimitBuckets index
	domains     map[string]*domainMetrics
	unknown     *domainMetrics
	anyReplaces bool // some rule replaces others: a call must look
}

type ruleState struct {
	rule *rlsconfig.Rule
	id   counter.Bucket
	// lim is what the counter counts against when counted (not unlimited,
	// requests_per_unit > 0): the limit capped at counter.MaxLimit.
	lim     counter.Limit
	counted bool
	scaleMS int64
	// current is the rule's current_limit, shared by every response.
	current *rlsv3.RateLimitResponse_RateLimit
	m       [numDecisions]prometheus.Counter
}

type limitState struct {
	bucket  string
	id      counter.Bucket
	unit    rlsconfig.Unit
	scaleMS int64
	usable  bool // the counter holds the unit's window
	m       [numDecisions]prometheus.Counter
}

// New returns a Service serving cfg, counting with lim and taking the
// limits of overridable rules from over (nil: no overrides). Its metrics
// go to reg.
func New(cfg Config, lim Limiter, over Overrides, reg prometheus.Registerer, log *slog.Logger, opts Options) (*Service, error) {
	if lim == nil || reg == nil || log == nil {
		return nil, errors.New("rls: New needs a limiter, a registerer and a logger")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	mt, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	s := &Service{
		limiter: lim, over: over, log: log, opts: opts, m: mt,
		statusOK:        &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK},
		statusUnlimited: &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32},
		// upstream's texts
		errDomain:      status.Error(codes.InvalidArgument, "rate limit domain must not be empty"),
		errDescriptors: status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty"),
	}
	s.keys.New = func() any { b := make([]byte, 0, 512); return &b }
	s.replies.New = func() any { return new(reply) }
	s.holds.New = func() any { return &leaseHold{s: s} }
	s.dec = checkwire.NewRateLimitDecoder(opts.MaxDescriptors, opts.MaxEntries)
	swap, err := s.prepare(cfg)
	if err != nil {
		return nil, err
	}
	swap()
	return s, nil
}

// Prepare validates snap's RLS rules for ShouldRateLimit under the
// settings in force and returns what makes them the configuration of the
// next call; it changes nothing itself. Calls in flight finish on the
// previous one. Counts are the counter's: a rule whose bucket id is
// unchanged keeps its counts.
func (s *Service) Prepare(snap *snapshot.Snapshot) (swap func(), err error) {
	if snap.RLS == nil {
		return nil, errors.New("no RLS rules: this node serves ShouldRateLimit")
	}
	return s.prepare(Config{Snapshot: snap, Settings: s.Settings()})
}

// prepare builds cfg's state and returns the swap that makes it the one
// in force; the swaps are serialised so that each forgets the series of
// the state it replaced.
func (s *Service) prepare(cfg Config) (func(), error) {
	next, err := s.build(cfg)
	if err != nil {
		return nil, err
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if old := s.cur.Swap(next); old != nil {
			s.m.forget(old, next)
		}
	}, nil
}

func (s *Service) build(cfg Config) (*state, error) {
	snap := cfg.Snapshot
	if snap == nil || snap.RLS == nil {
		return nil, errors.New("rls: no rules")
	}
	rc := snap.RLS
	rules, lbs := rc.Rules(), rc.LimitBuckets()
	settings, err := cfg.Settings.withDefaults()
	if err != nil {
		return nil, err
	}
	st := &state{
		cfg: rc, settings: settings,
		rules:   make([]ruleState, len(rules)),
		limits:  make([]limitState, len(lbs)),
		domains: make(map[string]*domainMetrics, len(rc.Domains())),
		unknown: s.m.forDomain(unknownDomain),
	}
	for _, d := range rc.Domains() {
		st.domains[d] = s.m.forDomain(d)
	}
	for i, b := range snap.RLSRules {
		r := &rules[i]
		rs := &st.rules[i]
		*rs = ruleState{rule: r, id: b.ID, scaleMS: r.Unit.Seconds() * 1000, m: s.m.forBucket(r.Bucket)}
		if r.Concurrency {
			if s.opts.Leases == nil {
				return nil, fmt.Errorf("rls: %s:%d:%d: rule %s counts requests in flight: the service has no lease table", r.File, r.Line, r.Column, r.StatsKey)
			}
			// No window: the unit is UNKNOWN.
			rs.current = &rlsv3.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: r.RequestsPerUnit}
			rs.lim, _ = r.Limit()
			continue
		}
		if !r.Unlimited {
			if rs.scaleMS <= 0 {
				return nil, fmt.Errorf("rls: %s:%d:%d: rule %s: unit %s is not a unit", r.File, r.Line, r.Column, r.StatsKey, r.Unit)
			}
			rs.current = &rlsv3.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: r.RequestsPerUnit, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(r.Unit)}
		}
		if l, ok := r.Limit(); ok {
			l.Limit = min(l.Limit, counter.MaxLimitFor(l.ScaleMS)) // far beyond what a window admits
			if err := l.Validate(); err != nil {
				return nil, fmt.Errorf("rls: %s:%d:%d: rule %s (%d per %s): the counter cannot hold it (windows are at most %s): %w",
					r.File, r.Line, r.Column, r.StatsKey, r.RequestsPerUnit, r.Unit, time.Duration(counter.MaxScaleMS)*time.Millisecond, err)
			}
			rs.lim, rs.counted = l, true
		}
		st.anyReplaces = st.anyReplaces || len(r.Replaces) > 0
	}
	for i, b := range snap.RLSLimits {
		lb := &lbs[i]
		ms := lb.Unit.Seconds() * 1000
		st.limits[i] = limitState{
			bucket: lb.Bucket, id: b.ID, unit: lb.Unit, scaleMS: ms,
			usable: ms > 0 && ms <= counter.MaxScaleMS,
			m:      s.m.forBucket(lb.Bucket),
		}
	}
	return st, nil
}

// Settings returns the settings in force, defaults filled in.
func (s *Service) Settings() Settings { return s.cur.Load().settings }

// matchKind says what a request descriptor counts against.
type matchKind uint8

const (
	kindNone     matchKind = iota // nothing: unknown domain, no rule
	kindRule                      // a configured rule
	kindLimit                     // a descriptor-supplied limit
	kindReplaced                  // a rule another matched rule replaces
)

// match is one descriptor's lookup: its rule or limit bucket and its
// counter key, key[start:end] of the call's key buffer.
type match struct {
	kind       matchKind
	idx        int
	start, end int
}

// inlineMatches descriptors are looked up without an allocation.
const inlineMatches = 16

// ShouldRateLimit implements envoy.service.ratelimit.v3.RateLimitService.
// Only a malformed request is an error (InvalidArgument), and ctx's error
// once the call was cancelled or timed out while it was decided, which
// gives back the leases it acquired (checkgrpc.Settle); every decision is
// a response (see the package doc).
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	now := s.opts.Now()
	r := new(reply) // gRPC encodes it after the call: not pooled
	err := s.decide(ctx, s.cur.Load(), req, now, r)
	s.m.duration.Observe(s.opts.Now().Sub(now).Seconds())
	if err != nil {
		return nil, err
	}
	if err := checkgrpc.Settle(ctx, r.hold()); err != nil {
		return nil, err
	}
	return &r.resp, nil
}

// RateLimitDecoder is the decoder of the lean path (checkwire.RateLimitServer):
// it keeps enough of a request for validate to refuse what the Options
// bound.
func (s *Service) RateLimitDecoder() *checkwire.RateLimitDecoder { return s.dec }

// AppendShouldRateLimit is ShouldRateLimit on the lean path
// (checkwire.RateLimitServer): the same decision on a request decoded by
// RateLimitDecoder, its answer appended to b as a gRPC message, the
// response built in a pooled reply (no allocation in steady state), with
// the leases it acquired as its Hold.
func (s *Service) AppendShouldRateLimit(ctx context.Context, req *checkwire.RateLimitRequest, b []byte) ([]byte, checkwire.Hold, error) {
	now := s.opts.Now()
	r := s.replies.Get().(*reply)
	err := s.decide(ctx, s.cur.Load(), req.Message(), now, r)
	s.m.duration.Observe(s.opts.Now().Sub(now).Seconds())
	if err == nil {
		b, err = checkwire.AppendRateLimitResponse(b, &r.resp)
	}
	h := r.hold()
	if r.release() {
		s.replies.Put(r)
	}
	return b, h, err
}

var _ checkwire.RateLimitServer = (*Service)(nil)

// decide answers req into r.
func (s *Service) decide(ctx context.Context, st *state, req *rlsv3.RateLimitRequest, now time.Time, r *reply) error {
	domain := req.GetDomain()
	dm, known := st.domains[domain]
	if !known {
		dm = st.unknown
	}
	descs := req.GetDescriptors()
	if err := s.validate(domain, descs); err != nil {
		dm.requests[codeInvalid].Inc()
		return err
	}

	bp := s.keys.Get().(*[]byte)
	key := (*bp)[:0]
	var matchBuf [inlineMatches]match
	ms := matchBuf[:0]
	if len(descs) > inlineMatches {
		ms = make([]match, 0, len(descs))
	}
	for _, d := range descs {
		var m match
		if known {
			m, key = s.match(st, domain, d, key)
		}
		ms = append(ms, m)
	}
	if st.anyReplaces {
		replace(st, ms)
	}

	r.reset(len(descs))
	var over bool
	for i, d := range descs {
		ds := s.status(ctx, st, dm, &ms[i], d, req.GetHitsAddend(), key, now, r.slot(i), &r.held)
		r.resp.Statuses[i] = ds
		over = over || ds.Code == rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if cap(key) <= maxPooledKeyBytes {
		*bp = key
		s.keys.Put(bp)
	}

	c := codeOK
	r.resp.OverallCode = rlsv3.RateLimitResponse_OK
	switch {
	case over && st.settings.ShadowMode:
		c = codeShadowOverLimit
	case over:
		c = codeOverLimit
		r.resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	dm.requests[c].Inc()
	if st.settings.ResponseHeaders {
		r.addHeaders(&st.settings)
	}
	return nil
}

// maxPooledKeyBytes: a key buffer grown past this (a request with huge
// values) is left to the garbage collector rather than kept in the pool.
const maxPooledKeyBytes = 16 << 10

// validate refuses what no well-formed request carries, before anything is
// counted: a request is answered whole or not at all. Its messages name
// the bound crossed, not the count: the lean decoder keeps one past each
// bound, so both paths refuse with the same words.
func (s *Service) validate(domain string, descs []*ratelimitv3.RateLimitDescriptor) error {
	switch {
	case domain == "":
		return s.errDomain
	case len(descs) == 0:
		return s.errDescriptors
	case len(descs) > s.opts.MaxDescriptors:
		return status.Errorf(codes.InvalidArgument, "rate limit request has more than %d descriptors", s.opts.MaxDescriptors)
	}
	for i, d := range descs {
		es := d.GetEntries()
		if len(es) > s.opts.MaxEntries {
			return status.Errorf(codes.InvalidArgument, "rate limit descriptor %d has more than %d entries", i, s.opts.MaxEntries)
		}
		for j, e := range es {
			if k := e.GetKey(); len(k) > s.opts.MaxKeyBytes {
				return status.Errorf(codes.InvalidArgument, "rate limit descriptor %d entry %d: key of %d bytes: at most %d", i, j, len(k), s.opts.MaxKeyBytes)
			}
			if v := e.GetValue(); len(v) > s.opts.MaxValueBytes {
				return status.Errorf(codes.InvalidArgument, "rate limit descriptor %d entry %d: value of %d bytes: at most %d", i, j, len(v), s.opts.MaxValueBytes)
			}
		}
	}
	return nil
}

// match looks one descriptor of a configured domain up: its own limit
// when it carries a usable one (upstream skips the configuration then),
// else the configuration's rule.
func (s *Service) match(st *state, domain string, d *ratelimitv3.RateLimitDescriptor, key []byte) (match, []byte) {
	start := len(key)
	if dl := d.GetLimit(); dl != nil {
		if i, ok := st.cfg.LimitBucket(domain, rlsconfig.Unit(dl.GetUnit())); ok && st.limits[i].usable {
			key = rlsconfig.AppendKey(d.GetEntries(), key)
			return match{kind: kindLimit, idx: i, start: start, end: len(key)}, key
		}
		s.m.ignored.Inc()
	}
	rule, key, _ := st.cfg.Match(domain, d.GetEntries(), key)
	if rule < 0 {
		return match{}, key
	}
	return match{kind: kindRule, idx: rule, start: start, end: len(key)}, key
}

// replace drops the matched rules whose name a matched rule replaces
// (unlimited ones included), as upstream: the names are collected from
// every matched rule first.
func replace(st *state, ms []match) {
	for i := range ms {
		if ms[i].kind != kindRule {
			continue
		}
		name := st.rules[ms[i].idx].rule.Name
		if name == "" { // replaces entries are never empty
			continue
		}
	search:
		for j := range ms {
			if ms[j].kind != kindRule && ms[j].kind != kindReplaced {
				continue
			}
			for _, n := range st.rules[ms[j].idx].rule.Replaces {
				if n == name {
					ms[i].kind = kindReplaced
					break search
				}
			}
		}
	}
}

// hitsOf is the descriptor's addend: its own hits_addend when set (0
// included: a check that counts nothing), else the request's, at least 1.
// Addends beyond counter.MaxLimit never fit, so they are capped just above.
func hitsOf(d *ratelimitv3.RateLimitDescriptor, requestHits uint32) int64 {
	if h := d.GetHitsAddend(); h != nil {
		return int64(min(h.GetValue(), counter.MaxLimit+1))
	}
	return max(1, int64(requestHits))
}

// target is what one descriptor counts against.
type target struct {
	m       *[numDecisions]prometheus.Counter
	bucket  string
	id      counter.Bucket
	lim     counter.Limit // the zero Limit: requests_per_unit 0, nothing to count against
	report  int64         // the limit the status reports
	scaleMS int64         // its window
	shadow  bool
	charge  bool // hits are counted whether or not they fit (rlsconfig.Rule.Charge)
	current *rlsv3.RateLimitResponse_RateLimit
}

// status decides one descriptor.
func (s *Service) status(ctx context.Context, st *state, dm *domainMetrics, m *match, d *ratelimitv3.RateLimitDescriptor,
	requestHits uint32, keys []byte, now time.Time, sl *slot, held **leaseHold) *rlsv3.RateLimitResponse_DescriptorStatus {
	var t target
	switch m.kind {
	case kindNone:
		dm.unmatched.Inc()
		return s.statusOK
	case kindReplaced:
		st.rules[m.idx].m[decReplaced].Inc()
		return s.statusOK
	}
	if m.kind == kindRule && st.rules[m.idx].rule.Concurrency {
		return s.lease(ctx, &st.rules[m.idx], d, keys[m.start:m.end], now, sl, held)
	}
	if d.GetIsNegativeHits() {
		// A refill is refused: this server gives no budget back, and
		// counting the hits as positive would charge a release again.
		if m.kind == kindLimit {
			st.limits[m.idx].m[decNegative].Inc()
		} else {
			st.rules[m.idx].m[decNegative].Inc()
		}
		return s.statusOK
	}
	switch m.kind {
	case kindLimit:
		ls := &st.limits[m.idx]
		rpu := d.GetLimit().GetRequestsPerUnit()
		sl.lim.RequestsPerUnit, sl.lim.Unit = rpu, rlsv3.RateLimitResponse_RateLimit_Unit(ls.unit)
		t = target{m: &ls.m, bucket: ls.bucket, id: ls.id, report: int64(rpu), scaleMS: ls.scaleMS, current: &sl.lim}
		if rpu > 0 {
			t.lim = counter.Limit{Limit: min(int64(rpu), counter.MaxLimitFor(ls.scaleMS)), ScaleMS: ls.scaleMS}
		}
	default:
		rs := &st.rules[m.idx]
		if rs.rule.Unlimited {
			rs.m[decUnlimited].Inc()
			return s.statusUnlimited
		}
		t = target{m: &rs.m, bucket: rs.rule.Bucket, id: rs.id, report: int64(rs.rule.RequestsPerUnit),
			scaleMS: rs.scaleMS, shadow: rs.rule.Shadow, charge: rs.rule.Charge, current: rs.current}
		if rs.counted {
			t.lim = rs.lim
			if rs.rule.Overridable && s.over != nil {
				if l, ok := s.overrideOf(rs, d); ok && l != rs.lim {
					t.lim, t.report, t.scaleMS, t.current = l, l.Limit, l.ScaleMS, sl.override(rs.rule.Name, l)
				}
			}
		}
	}
	return s.count(ctx, st, &t, hitsOf(d, requestHits), keys[m.start:m.end], now, sl)
}

// concurrencyRetryS is the duration_until_reset of a concurrency rule's
// statuses: a slot frees when a request in flight ends, which no window
// predicts; a second is the least Envoy's Retry-After can say (as Check).
const concurrencyRetryS = 1

// lease decides a descriptor of a concurrency rule, whose last entry is
// the request id: with is_negative_hits (Envoy's apply_on_stream_done
// release) it frees that request's lease of the key, if this cluster
// granted one, and answers OK; otherwise it acquires one, whatever the
// addend (a request holds one slot), OVER_LIMIT when the key has its
// limit in flight, the lease table is full (fail closed) or the id is
// empty, too long or already holds a lease of the key. A shadow_mode rule
// answers OK where it would be over, holding nothing. An acquired lease
// is added to *held, given back if the answer is not taken.
func (s *Service) lease(ctx context.Context, rs *ruleState, d *ratelimitv3.RateLimitDescriptor, key []byte, now time.Time, sl *slot, held **leaseHold) *rlsv3.RateLimitResponse_DescriptorStatus {
	id := rlsconfig.RequestID(d.GetEntries())
	if d.GetIsNegativeHits() {
		if s.opts.Leases.Release(rs.id, keyString(key), id) {
			rs.m[decReleased].Inc()
		} else {
			rs.m[decNegative].Inc() // unknown here: forwarded to the peers
		}
		return s.statusOK
	}
	r := s.opts.Leases.Acquire(rs.id, keyString(key), id, rs.lim.Limit, rs.rule.LeaseTTL, now)
	if r.Allowed() {
		rs.m[decAllowed].Inc()
		if *held == nil {
			*held = s.holds.Get().(*leaseHold)
		}
		(*held).add(rs, keyString(key), id)
		return sl.set(rlsv3.RateLimitResponse_OK, rs.current, uint32(min(max(0, rs.lim.Limit-r.InFlight), math.MaxUint32)), concurrencyRetryS)
	}
	t := target{bucket: rs.rule.Bucket, report: rs.lim.Limit, scaleMS: rs.lim.ScaleMS, shadow: rs.rule.Shadow}
	s.logOver(ctx, &t, key)
	switch {
	case rs.rule.Shadow:
		rs.m[decShadowDenied].Inc()
		return sl.set(rlsv3.RateLimitResponse_OK, rs.current, 0, concurrencyRetryS)
	case r.Outcome == inflight.DeniedFull:
		rs.m[decOverflow].Inc()
	default: // the limit, or the request id (inflight counts each reason)
		rs.m[decDenied].Inc()
	}
	return sl.set(rlsv3.RateLimitResponse_OVER_LIMIT, rs.current, 0, concurrencyRetryS)
}

// count counts hits against t and fills the descriptor's status.
func (s *Service) count(ctx context.Context, st *state, t *target, hits int64, key []byte, now time.Time, sl *slot) *rlsv3.RateLimitResponse_DescriptorStatus {
	o := s.spend(st, t, hits, key, now)
	c := rlsv3.RateLimitResponse_OK
	var remaining int64
	switch {
	case o.overflow:
		// The key's count is unknown: remaining 0; the setting decides.
		t.m[decOverflow].Inc()
		if o.over {
			c = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	case o.charged:
		if o.over {
			s.logOver(ctx, t, key)
			t.m[decChargedOver].Inc()
			if !t.shadow {
				c = rlsv3.RateLimitResponse_OVER_LIMIT
			}
		} else {
			t.m[decCharged].Inc()
			remaining = min(max(0, t.report-o.count), math.MaxUint32)
		}
	case o.over:
		s.logOver(ctx, t, key)
		if t.shadow {
			t.m[decShadowDenied].Inc()
		} else {
			t.m[decDenied].Inc()
			c = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	default:
		t.m[decAllowed].Inc()
		remaining = min(max(0, t.report-o.count), math.MaxUint32)
	}
	return sl.set(c, t.current, uint32(remaining), seconds(o.resetMS))
}

// spent is what the counter made of a descriptor's hits.
type spent struct {
	over     bool // over the limit (or an untracked key the settings deny)
	overflow bool // the key could not be tracked
	charged  bool // a charge, counted whether or not it fit
	count    int64
	resetMS  int64 // until the window ends, or until a sliding key may retry
}

// spend counts hits against t's key: a check without counting (hits 0)
// peeks, a charge is counted whether or not it fits, other hits are
// taken only if all of them fit.
func (s *Service) spend(st *state, t *target, hits int64, key []byte, now time.Time) (o spent) {
	var r counter.Result
	switch {
	case t.lim.Limit == 0:
		// Nothing is ever counted, and any hit would be refused: over,
		// a check without counting (hits 0) included.
		return spent{over: true, resetMS: untilWindowEnd(now, t.scaleMS)}
	case hits == 0:
		r = s.limiter.Peek(t.id, keyString(key), t.lim, now)
		// A check without counting is over when one more hit would be
		// refused: a denied hit is not counted here, so "the count exceeds
		// the limit" (upstream's test) would never hold for a key this
		// node denied. An untracked key (Overflow) has no count: 0.
		o.over = !r.Overflow && !r.Allowed
	case t.charge:
		// A charge is counted whether or not it fits: its cost was spent
		// (Envoy reports it when the stream is done and ignores the
		// answer). It is over when the count is past the limit.
		r = s.limiter.Incr(t.id, keyString(key), t.lim, hits, now)
		o.overflow = r.Overflow
		o.charged = !r.Overflow
		o.over = (r.Overflow && st.settings.DenyOverflow) || (!r.Overflow && r.Count > t.lim.Limit)
	default:
		r = s.limiter.TakeN(t.id, keyString(key), t.lim, hits, now)
		o.overflow = r.Overflow
		o.over = (r.Overflow && st.settings.DenyOverflow) || (!r.Overflow && !r.Allowed)
	}
	o.count, o.resetMS = r.Count, r.ResetMS
	if o.over && !o.overflow && t.lim.Algorithm == counter.Sliding {
		o.resetMS = r.RetryAfterMS
	}
	return o
}

// overrideOf is the tenant override of an overridable rule's bucket for
// d, whose first entry's value is the tenant: ok false without one (no
// tenant, none filed, or a limit the counter cannot hold).
func (s *Service) overrideOf(rs *ruleState, d *ratelimitv3.RateLimitDescriptor) (counter.Limit, bool) {
	tenant := firstValue(d)
	if tenant == "" {
		return counter.Limit{}, false
	}
	l, ok := s.over.OverrideFor(rs.id, tenant)
	return l, ok && l.Validate() == nil
}

// firstValue is the tenant of an overridable rule: the descriptor's first
// entry's value.
func firstValue(d *ratelimitv3.RateLimitDescriptor) string {
	if es := d.GetEntries(); len(es) > 0 {
		return es[0].GetValue()
	}
	return ""
}

// untilWindowEnd is the time in ms from now to the end of its
// wall-clock-aligned window of scaleMS.
func untilWindowEnd(now time.Time, scaleMS int64) int64 {
	ms := now.UnixMilli() % scaleMS
	if ms < 0 {
		ms += scaleMS
	}
	return scaleMS - ms
}

// seconds rounds milliseconds up to whole seconds, at least 1 (upstream's
// duration_until_reset is 1..unit seconds, never 0).
func seconds(ms int64) int64 {
	if ms <= 1000 {
		return 1
	}
	return (ms + 999) / 1000
}

// logOver writes the debug line of a descriptor over its limit. The key is
// in the log (debug level only), never in a metric label.
func (s *Service) logOver(ctx context.Context, t *target, key []byte) {
	if !s.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	msg := "rate limited"
	if t.shadow {
		msg = "rate limit exceeded in shadow mode"
	}
	s.log.LogAttrs(ctx, slog.LevelDebug, msg,
		slog.String("bucket", t.bucket),
		slog.String("key", string(key)),
		slog.Int64("limit", t.report),
		slog.Int64("scale_ms", t.scaleMS),
	)
}
