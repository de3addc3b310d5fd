package authz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/accesslog"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkgrpc"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// Limiter counts hits per (bucket, key) in windows. *counter.Store is one.
type Limiter interface {
	Take(bucket counter.Bucket, key string, lim counter.Limit, now time.Time) counter.Result
	TakeN(bucket counter.Bucket, key string, lim counter.Limit, n int64, now time.Time) counter.Result
	Peek(bucket counter.Bucket, key string, lim counter.Limit, now time.Time) counter.Result
	ReleaseN(bucket counter.Bucket, key string, lim counter.Limit, window, n int64)
}

var _ Limiter = (*counter.Store)(nil)

// Config is what the Service needs of the configuration.
type Config struct {
	// Buckets are the rules file's, indexed as the matcher's buckets (its
	// dense indices). Their names are match.ValidBucketName: safe in
	// a Structured Field string, a JSON body and a metric label.
	Buckets []snapshot.Bucket
	// Routes are the labels of the matcher's routes, by route index (its
	// name, else its path template): the route of a login's metadata.
	Routes []string
	// RouteCosts are the constant costs of each route's buckets, by route
	// index (configfile.Route.Costs); nil: every request costs 1.
	RouteCosts []map[int]int64
	// DenyUnreadableAccount refuses (403) a login whose account cannot
	// be read, in the buckets keyed by account; otherwise it is counted
	// under match.UnreadableAccount.
	DenyUnreadableAccount bool
}

// Service answers Envoy's Check calls. Create it with New; a reload swaps
// its configuration while it serves (Prepare).
type Service struct {
	authv3.UnimplementedAuthorizationServer

	gen     atomic.Pointer[generation]
	limiter Limiter
	leases  Leases // nil: no concurrency bucket may be configured
	over    limits.Overrides
	log     *slog.Logger
	now     func() time.Time
	m       *metrics
	holds   sync.Pool // *hold

	// Immutable parts shared by every response.
	statusOK, statusLimited, statusDenied *rpcstatus.Status
	statusUnreadable, statusBadRequestID  *rpcstatus.Status
	statusBadCost                         *rpcstatus.Status
	http429, http403, http400             *typev3.HttpStatus
	allowBare, pathTooLong                *authv3.CheckResponse
	allowBarePre, pathTooLongPre          *checkwire.Prebuilt
}

var _ checkwire.Server = (*Service)(nil)

// generation is one configuration, immutable: a Check loads it once and
// decides wholly under it, so a check in flight during a reload finishes on
// the configuration it started with.
type generation struct {
	matcher            *match.Engine
	dec                *checkwire.Decoder // reads what matcher needs
	limits             *snapshot.Resolver
	routes             []string
	denyUnreadableAcct bool
	leases             bool // some bucket counts requests in flight
	buckets            []bucketState
	// routeCosts are the constant costs of each route's buckets, by route
	// index; nil when no route gives one (every request costs 1).
	routeCosts [][]routeCost
}

type bucketState struct {
	id   counter.Bucket  // in the counter
	rule snapshot.Bucket // its Kind says how a check spends from it
	// quoted is the bucket name as a Structured Field string; unit the
	// RateLimit-Policy parameters of its quota unit after it (";qu=…",
	// empty for requests). noFields: a unit the draft has no name for,
	// left out of the header fields.
	quoted   string
	unit     string
	noFields bool
	metrics  bucketMetrics
}

// routeCost is a route's constant cost of one of its buckets.
type routeCost struct {
	bucket int // index into Config.Buckets
	n      int64
}

// Options are the optional parts of a Service.
type Options struct {
	// Now is the clock; nil means time.Now. Only tests set it.
	Now func() time.Time
	// Overrides are the tenant overrides Prepare resolves a snapshot's
	// limits over; nil: the configured limits only.
	Overrides limits.Overrides
	// Leases holds the concurrency buckets' leases; nil: a configuration
	// with a concurrency bucket is refused.
	Leases Leases
}

// New returns a Service for cfg, matching requests with m, resolving
// limits with limits and counting with lim. cfg must describe the buckets
// and routes m was compiled from. Its metrics go to reg.
func New(cfg Config, m *match.Engine, lim Limiter, limits *snapshot.Resolver, reg prometheus.Registerer, log *slog.Logger, opts Options) (*Service, error) {
	if lim == nil || reg == nil || log == nil {
		return nil, errors.New("authz: New needs a matcher, a limiter, limits, a registerer and a logger")
	}
	if err := checkConfig(cfg, m, limits, opts.Leases); err != nil {
		return nil, err
	}
	mt, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	s := &Service{
		limiter: lim, leases: opts.Leases, over: opts.Overrides, log: log, now: opts.Now, m: mt,
		statusOK:      &rpcstatus.Status{Code: int32(codes.OK)},
		statusLimited: &rpcstatus.Status{Code: int32(codes.ResourceExhausted), Message: "rate limited"},
		statusDenied:  &rpcstatus.Status{Code: int32(codes.PermissionDenied), Message: "request lacks a rate-limit key"},
		http429:       &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
		http403:       &typev3.HttpStatus{Code: typev3.StatusCode_Forbidden},
		http400:       &typev3.HttpStatus{Code: typev3.StatusCode_BadRequest},
		statusBadCost: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "request cost cannot be read"},
	}
	s.statusBadRequestID = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "request lacks a usable " + RequestIDHeader}
	s.statusUnreadable = &rpcstatus.Status{Code: int32(codes.PermissionDenied), Message: "login account cannot be read"}
	if s.now == nil {
		s.now = time.Now
	}
	s.holds.New = func() any { return &hold{s: s} }
	s.allowBare = &authv3.CheckResponse{Status: s.statusOK}
	s.pathTooLong = &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "path too long"},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode_URITooLong},
			Headers: []*corev3.HeaderValueOption{header(new(corev3.HeaderValueOption), new(corev3.HeaderValue), "content-type", "application/json")},
			Body:    `{"error":"path_too_long"}` + "\n",
		}},
	}
	if s.allowBarePre, err = checkwire.Prebuild(s.allowBare); err != nil {
		return nil, err
	}
	if s.pathTooLongPre, err = checkwire.Prebuild(s.pathTooLong); err != nil {
		return nil, err
	}
	s.gen.Store(s.newGeneration(cfg, m, limits))
	return s, nil
}

// Prepare validates snap for the Check, its limits resolved over
// Options.Overrides, and returns what makes it the configuration of the
// next Check; it changes nothing itself. A Check in flight finishes on the
// previous one. The metrics stay those registered by New (children for
// new bucket names are added).
func (s *Service) Prepare(snap *snapshot.Snapshot) (swap func(), err error) {
	return s.prepare(ConfigFrom(snap), snap.Matcher, snapshot.NewResolver(snap, s.over))
}

func (s *Service) prepare(cfg Config, m *match.Engine, limits *snapshot.Resolver) (func(), error) {
	if err := checkConfig(cfg, m, limits, s.leases); err != nil {
		return nil, err
	}
	g := s.newGeneration(cfg, m, limits)
	return func() {
		old := s.gen.Swap(g)
		// The series of buckets the new configuration no longer has go: a
		// renamed bucket must not leave a frozen one behind.
		keep := make(map[string]bool, len(g.buckets))
		for _, b := range g.buckets {
			keep[b.rule.Name] = true
		}
		for _, b := range old.buckets {
			if !keep[b.rule.Name] {
				s.m.forget(b.rule.Name)
			}
		}
	}, nil
}

// ConfigFrom is the Check's part of snap: the rules file's buckets and
// routes.
func ConfigFrom(snap *snapshot.Snapshot) Config {
	r := snap.Rules
	c := Config{
		Buckets:               snap.RuleBuckets(),
		Routes:                make([]string, len(r.Routes)),
		DenyUnreadableAccount: r.Keys.UnreadableAccount == configfile.AccountDeny,
	}
	for i, rt := range r.Routes {
		c.Routes[i] = rt.Name
		if rt.Name == "" {
			c.Routes[i] = rt.Path
		}
		if rt.Costs != nil {
			if c.RouteCosts == nil {
				c.RouteCosts = make([]map[int]int64, len(r.Routes))
			}
			c.RouteCosts[i] = rt.Costs
		}
	}
	return c
}

func checkConfig(cfg Config, m *match.Engine, limits *snapshot.Resolver, leases Leases) error {
	if m == nil || limits == nil {
		return errors.New("authz: the configuration needs a matcher and limits")
	}
	if len(cfg.Buckets) != m.NumBuckets() || len(cfg.Routes) != m.NumRoutes() {
		return fmt.Errorf("authz: the config has %d buckets and %d routes, the matcher %d and %d", len(cfg.Buckets), len(cfg.Routes), m.NumBuckets(), m.NumRoutes())
	}
	for _, b := range cfg.Buckets {
		if !match.ValidBucketName(b.Name) {
			return fmt.Errorf("authz: %q is not a bucket name", b.Name)
		}
		if b.Kind == snapshot.InFlight && leases == nil {
			return fmt.Errorf("authz: bucket %q counts requests in flight, and the service has no lease table", b.Name)
		}
	}
	if cfg.RouteCosts != nil && len(cfg.RouteCosts) != len(cfg.Routes) {
		return fmt.Errorf("authz: the config has costs of %d routes and %d routes", len(cfg.RouteCosts), len(cfg.Routes))
	}
	for _, costs := range cfg.RouteCosts {
		for b, n := range costs {
			if int(b) >= len(cfg.Buckets) || n < 1 {
				return fmt.Errorf("authz: a route cost %d of bucket %d is out of range", n, b)
			}
		}
	}
	return nil
}

func (s *Service) newGeneration(cfg Config, m *match.Engine, limits *snapshot.Resolver) *generation {
	g := &generation{matcher: m, dec: checkwire.ForEngine(m), limits: limits, routes: cfg.Routes, denyUnreadableAcct: cfg.DenyUnreadableAccount}
	for i, b := range cfg.Buckets {
		if b.Kind == snapshot.InFlight && !g.leases {
			// The decoder keeps the request id too.
			g.leases = true
			g.dec = checkwire.NewDecoder(append(slices.Clone(m.HeaderNames()), RequestIDHeader), m.WantsBody())
		}
		bs := bucketState{
			id:     b.ID,
			rule:   b,
			quoted: strconv.Quote(b.Name), // names are [a-z0-9_]: a valid sf-string
		}
		costed := b.Kind == snapshot.RequestCost || (b.Kind == snapshot.Requests && hasRouteCost(cfg.RouteCosts, i))
		bs.metrics = s.m.forBucket(b.Name, costed)
		switch u := b.Cost.QuotaUnit(); u {
		case "requests":
		case "":
			bs.noFields = true
		default:
			bs.unit = `;qu="` + u + `"`
		}
		g.buckets = append(g.buckets, bs)
	}
	for i, costs := range cfg.RouteCosts {
		if g.routeCosts == nil {
			g.routeCosts = make([][]routeCost, len(cfg.RouteCosts))
		}
		for b, n := range costs {
			g.routeCosts[i] = append(g.routeCosts[i], routeCost{b, n})
		}
	}
	return g
}

func hasRouteCost(costs []map[int]int64, b int) bool {
	for _, c := range costs {
		if _, ok := c[b]; ok {
			return true
		}
	}
	return false
}

// cost is what a hit of b costs on route (an index, or -1): the route's
// constant, or 1.
func (g *generation) cost(route, b int) int64 {
	if route >= 0 && route < len(g.routeCosts) {
		for _, c := range g.routeCosts[route] {
			if c.bucket == b {
				return c.n
			}
		}
	}
	return 1
}

// taken is a hit already counted for the current request, or a lease it
// holds (lease), to give back if a later bucket denies it or, when it is
// a reservation, if Envoy never takes the answer.
type taken struct {
	b      *bucketState
	key    string
	lim    counter.Limit
	window int64
	n      int64
	// lease: a lease of b under requestID instead of a hit.
	lease     bool
	requestID string
}

// reserved reports whether t is given back when the check's answer is
// not taken: a lease, or a cost taken at the check. A hit of one request
// stays counted, as the request did arrive.
func (t *taken) reserved() bool { return t.lease || t.b.metrics.costAdmitted != nil }

// applied is one bucket's verdict, for the RateLimit header fields.
type applied struct {
	b         *bucketState
	lim       counter.Limit
	remaining int64
	resetMS   int64
}

// maxApplied bounds the buckets reported in headers; more are counted and
// enforced all the same.
const maxApplied = 8

// Check implements envoy.service.auth.v3.Authorization. Every outcome is
// a decision (see the package doc); the only error is ctx's, once the
// call was cancelled or timed out while it was decided, which gives back
// what the decision reserved (checkgrpc.Settle).
func (s *Service) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	now := s.now()
	g := s.gen.Load()
	in := g.dec.FromMessage(req)
	var hold checkwire.Hold
	resp := s.decideOn(ctx, g, &in, now, &hold)
	s.m.duration.Observe(s.now().Sub(now).Seconds())
	if err := checkgrpc.Settle(ctx, hold); err != nil {
		return nil, err
	}
	return resp, nil
}

// Decoder implements checkwire.Server: what the current configuration
// reads of a request.
func (s *Service) Decoder() *checkwire.Decoder { return s.gen.Load().dec }

// CheckWire implements checkwire.Server: Check on the request as the lean
// decoder read it, answering constant responses with their prebuilt
// encodings, with what the decision reserved as the response's Hold.
func (s *Service) CheckWire(ctx context.Context, req *checkwire.Request) (checkwire.Response, error) {
	now := s.now()
	g := s.gen.Load()
	if req.Decoder() != g.dec {
		// The configuration changed since the request was decoded: read
		// what this one needs. Whether bytes decode does not depend on
		// the Decoder, so this cannot fail where the first decode did not.
		if err := req.DecodeWith(g.dec); err != nil {
			return checkwire.Response{}, status.Errorf(codes.Internal, "authz: decode the request again: %v", err)
		}
	}
	var hold checkwire.Hold
	resp := s.decideOn(ctx, g, req.Request(), now, &hold)
	s.m.duration.Observe(s.now().Sub(now).Seconds())
	switch resp {
	case s.allowBare:
		return s.allowBarePre.Response().Holding(hold), nil
	case s.pathTooLong:
		return s.pathTooLongPre.Response(), nil
	}
	return checkwire.Message(resp).Holding(hold), nil
}

// decideOn decides on in under g; the generic and the wire path share it.
// An allowed request's reservations (leases, costs taken) are left in
// *hold, for the caller to end (checkwire.Hold); nil when none.
func (s *Service) decideOn(ctx context.Context, g *generation, in *checkreq.Request, now time.Time, hold *checkwire.Hold) *authv3.CheckResponse {
	var descBuf [maxApplied]match.Descriptor
	res := g.matcher.Describe(in, descBuf[:0])
	if res.UnknownBuckets > 0 {
		s.m.unknown.Add(float64(res.UnknownBuckets))
	}
	if res.PathTooLong {
		// A path no route can hold: letting it through uncounted would let
		// a flood of long paths past every limit.
		s.m.pathTooLong.Inc()
		return s.pathTooLong
	}
	if len(res.Descriptors) == 0 {
		s.m.unmatched.Inc()
		return s.allowBare
	}

	tx := spending{g: g, route: res.Route}
	var (
		takenBuf   [maxApplied]taken
		appliedBuf [maxApplied]applied
	)
	tx.hits, tx.verdicts = takenBuf[:0], appliedBuf[:0]
	for _, d := range res.Descriptors {
		var deny *authv3.CheckResponse
		if tx, deny = s.spend(ctx, tx, in, d, now); deny != nil {
			s.giveBack(tx.hits)
			if tx.meterDenied {
				deny.DynamicMetadata = s.chargeMetadata(g, res, true)
			}
			return deny
		}
	}
	for _, t := range tx.hits {
		if t.b.metrics.costAdmitted != nil {
			t.b.metrics.costAdmitted.Add(float64(t.n))
		}
	}
	*hold = s.hold(tx.hits)
	var md *structpb.Struct
	if tx.charged {
		md = s.chargeMetadata(g, res, false)
	}
	if tx.leased {
		md = withLeases(md, tx.hits)
	}
	return s.allow(tx.verdicts, md)
}

// spending is one Check's spending of the buckets that apply, as a
// transaction: each bucket spent is recorded in hits, and a refusal by
// any bucket gives all of them back (decideOn does). It is passed and
// returned by value, so that its buffers stay on decideOn's stack.
type spending struct {
	g        *generation
	route    int       // the route that applies, or -1
	hits     []taken   // counts and leases taken, to give back on a refusal
	verdicts []applied // for the RateLimit header fields
	charged  bool      // a bucket is charged after the response: the access log needs its keys
	leased   bool      // hits holds a lease
	// meterDenied: a bucket over its limit refused the request while one
	// is charged after the response; the refusal carries the keys too.
	meterDenied bool
}

// spend spends d's bucket for the request in tx, and returns tx and nil,
// or the answer that refuses the request (its bucket's metrics counted).
func (s *Service) spend(ctx context.Context, tx spending, in *checkreq.Request, d match.Descriptor, now time.Time) (spending, *authv3.CheckResponse) {
	g := tx.g
	b := &g.buckets[d.Bucket]
	lim, ok := g.limits.Limit(d.Bucket, d.Key)
	if !ok { // a bucket without a limit, named by Envoy
		s.m.unknown.Inc()
		return tx, nil
	}
	kind := b.rule.Kind
	tx.charged = tx.charged || kind.AfterResponse()
	switch {
	case d.Key == match.UnreadableAccount && b.rule.Key.Kind == match.KeyAccount && g.denyUnreadableAcct:
		b.metrics.checks[decUnreadable].Inc()
		return tx, s.denyUnreadable(b)
	case d.Key == "":
		b.metrics.checks[decMissingKey].Inc()
		if b.rule.DenyMissingKey {
			return tx, s.denyMissingKey(b)
		}
		return tx, nil
	case kind == snapshot.InFlight:
		v, held, acquired, deny := s.acquire(ctx, b, d.Key, requestID(in), lim, now)
		if acquired {
			tx.hits = append(tx.hits, held)
			tx.leased = true
		}
		if deny == nil {
			tx.verdicts = addVerdict(tx.verdicts, v)
		}
		return tx, deny
	}
	var r counter.Result
	n := int64(1)
	switch {
	case kind.AfterResponse():
		r = s.limiter.Peek(b.id, d.Key, lim, now)
	case kind == snapshot.Requests && g.routeCosts == nil:
		r = s.limiter.Take(b.id, d.Key, lim, now)
	case kind == snapshot.RequestCost:
		var problem configfile.CostProblem
		v, present := in.Headers.Get(b.rule.Cost.RequestHeader())
		if n, problem = b.rule.Cost.Request(v, present); problem != configfile.CostOK {
			b.metrics.checks[decInvalidCost].Inc()
			b.metrics.costRefused[problem].Inc()
			if b.rule.Shadow { // reported, never refused: shadow turns a new budget on safely
				return tx, nil
			}
			return tx, s.denyInvalidCost(b, problem)
		}
		r = s.limiter.TakeN(b.id, d.Key, lim, n, now)
	default:
		n = g.cost(tx.route, d.Bucket)
		r = s.limiter.TakeN(b.id, d.Key, lim, n, now)
	}
	return s.record(ctx, tx, b, d.Key, lim, r, n)
}

// record counts what the counter answered for b's key (n of its budget
// asked), keeps a hit taken in tx, and returns tx and the refusal of a
// bucket denying, or nil.
func (s *Service) record(ctx context.Context, tx spending, b *bucketState, key string, lim counter.Limit, r counter.Result, n int64) (spending, *authv3.CheckResponse) {
	peek := b.rule.Kind.AfterResponse()
	switch {
	case r.Overflow:
		b.metrics.checks[decOverflow].Inc()
		if b.rule.DenyOverflow {
			r.RetryAfterMS = r.ResetMS
			return tx, s.denyLimited(ctx, b, key, lim, r)
		}
		return tx, nil
	case r.Allowed:
		b.metrics.checks[decAllowed].Inc()
		if !peek {
			tx.hits = append(tx.hits, taken{b: b, key: key, lim: lim, window: r.Window, n: n})
		}
	default:
		b.metrics.exceeded.Inc()
		if b.metrics.costDenied != nil && !peek {
			b.metrics.costDenied.Add(float64(n))
		}
		if !b.rule.Shadow {
			b.metrics.checks[decDenied].Inc()
			tx.meterDenied = tx.charged
			return tx, s.denyLimited(ctx, b, key, lim, r)
		}
		b.metrics.checks[decShadowDenied].Inc()
		s.logLimited(ctx, "rate limit exceeded in shadow mode", b, key, lim, r)
	}
	if !b.noFields {
		tx.verdicts = addVerdict(tx.verdicts, applied{b, lim, r.Remaining, r.ResetMS})
	}
	return tx, nil
}

// addVerdict records one key's verdict for the RateLimit header fields:
// one item per bucket, the key with the least remaining when a bucket has
// several (a login presenting two accounts), at most maxApplied buckets.
func addVerdict(vs []applied, v applied) []applied {
	for i := range vs {
		if vs[i].b == v.b {
			if v.remaining < vs[i].remaining {
				vs[i] = v
			}
			return vs
		}
	}
	if len(vs) < maxApplied {
		vs = append(vs, v)
	}
	return vs
}

func (s *Service) giveBack(hits []taken) {
	for _, t := range hits {
		if t.lease {
			s.leases.Release(t.b.id, t.key, t.requestID)
			continue
		}
		s.limiter.ReleaseN(t.b.id, t.key, t.lim, t.window, t.n)
	}
}

// seconds rounds milliseconds up to whole seconds, at least 1: Retry-After
// must never tell a client to come back before the window ends.
func seconds(ms int64) int64 {
	if ms <= 1000 {
		return 1
	}
	return (ms + 999) / 1000
}

// appendPolicy appends one RateLimit-Policy item: "name";q=100;w=1, and
// the quota unit of a budget in bytes (;qu="content-bytes"); a
// concurrency bucket's: see appendConcurrencyPolicy.
func appendPolicy(dst []byte, b *bucketState, lim counter.Limit) []byte {
	if b.rule.Kind == snapshot.InFlight {
		return appendConcurrencyPolicy(dst, b, lim)
	}
	dst = append(dst, b.quoted...)
	dst = append(dst, ";q="...)
	dst = strconv.AppendInt(dst, lim.Limit, 10)
	dst = append(dst, ";w="...)
	dst = strconv.AppendInt(dst, seconds(lim.ScaleMS), 10)
	return append(dst, b.unit...)
}

// appendRateLimit appends one RateLimit item: "name";r=99;t=1.
func appendRateLimit(dst []byte, b *bucketState, remaining, resetMS int64) []byte {
	dst = append(dst, b.quoted...)
	dst = append(dst, ";r="...)
	dst = strconv.AppendInt(dst, remaining, 10)
	dst = append(dst, ";t="...)
	return strconv.AppendInt(dst, seconds(resetMS), 10)
}

func header(opt *corev3.HeaderValueOption, val *corev3.HeaderValue, key, value string) *corev3.HeaderValueOption {
	val.Key, val.Value = key, value
	opt.Header = val
	opt.AppendAction = corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
	return opt
}

// okReply is an allowed response in one allocation.
type okReply struct {
	resp authv3.CheckResponse
	wrap authv3.CheckResponse_OkResponse
	ok   authv3.OkHttpResponse
	ptrs [2]*corev3.HeaderValueOption
	opts [2]corev3.HeaderValueOption
	vals [2]corev3.HeaderValue
}

func (s *Service) allow(verdicts []applied, md *structpb.Struct) *authv3.CheckResponse {
	if len(verdicts) == 0 && md == nil {
		return s.allowBare
	}
	r := new(okReply)
	r.resp.Status = s.statusOK
	r.resp.DynamicMetadata = md
	if len(verdicts) == 0 {
		return &r.resp
	}
	// Both header values in one string: one allocation.
	var buf [256]byte
	out := buf[:0]
	for i, v := range verdicts {
		if i > 0 {
			out = append(out, ", "...)
		}
		out = appendPolicy(out, v.b, v.lim)
	}
	split := len(out)
	for i, v := range verdicts {
		if i > 0 {
			out = append(out, ", "...)
		}
		out = appendRateLimit(out, v.b, v.remaining, v.resetMS)
	}
	both := string(out)
	r.ptrs[0] = header(&r.opts[0], &r.vals[0], "ratelimit-policy", both[:split])
	r.ptrs[1] = header(&r.opts[1], &r.vals[1], "ratelimit", both[split:])
	r.ok.ResponseHeadersToAdd = r.ptrs[:]
	r.wrap.OkResponse = &r.ok
	r.resp.HttpResponse = &r.wrap
	return &r.resp
}

// deniedReply is a denial in one allocation.
type deniedReply struct {
	resp   authv3.CheckResponse
	wrap   authv3.CheckResponse_DeniedResponse
	denied authv3.DeniedHttpResponse
	ptrs   [4]*corev3.HeaderValueOption
	opts   [4]corev3.HeaderValueOption
	vals   [4]corev3.HeaderValue
}

func (s *Service) denyLimited(ctx context.Context, b *bucketState, key string, lim counter.Limit, r counter.Result) *authv3.CheckResponse {
	s.logLimited(ctx, "rate limited", b, key, lim, r)
	retry := seconds(r.RetryAfterMS)

	var buf [512]byte
	out := strconv.AppendInt(buf[:0], retry, 10)
	i1 := len(out)
	out = appendPolicy(out, b, lim)
	i2 := len(out)
	out = appendRateLimit(out, b, 0, r.RetryAfterMS)
	i3 := len(out)
	if b.rule.Kind == snapshot.InFlight {
		out = append(out, `{"error":"concurrency_limited","bucket":`...)
		out = append(out, b.quoted...)
		out = append(out, `,"limit":`...)
		out = strconv.AppendInt(out, lim.Limit, 10)
	} else {
		out = append(out, `{"error":"rate_limited","bucket":`...)
		out = append(out, b.quoted...)
		out = append(out, `,"limit":`...)
		out = strconv.AppendInt(out, lim.Limit, 10)
		out = append(out, `,"window_seconds":`...)
		out = strconv.AppendInt(out, seconds(lim.ScaleMS), 10)
	}
	out = append(out, `,"retry_after_seconds":`...)
	out = strconv.AppendInt(out, retry, 10)
	out = append(out, "}\n"...)
	all := string(out)

	d := new(deniedReply)
	d.ptrs[0] = header(&d.opts[0], &d.vals[0], "retry-after", all[:i1])
	d.ptrs[1] = header(&d.opts[1], &d.vals[1], "content-type", "application/json")
	d.ptrs[2] = header(&d.opts[2], &d.vals[2], "ratelimit-policy", all[i1:i2])
	d.ptrs[3] = header(&d.opts[3], &d.vals[3], "ratelimit", all[i2:i3])
	d.denied.Status = s.http429
	d.denied.Headers = d.ptrs[:]
	if b.noFields {
		d.denied.Headers = d.ptrs[:2]
	}
	d.denied.Body = all[i3:]
	d.wrap.DeniedResponse = &d.denied
	d.resp.Status = s.statusLimited
	d.resp.HttpResponse = &d.wrap
	return &d.resp
}

func (s *Service) denyMissingKey(b *bucketState) *authv3.CheckResponse {
	return s.denyStatus(b, s.statusDenied, s.http403, "missing_rate_limit_key")
}

// denyInvalidCost refuses (400) a request whose cost of b cannot be read:
// absent without a configured missing, not a number, negative, repeated
// or above max. The body names the bucket and the problem.
func (s *Service) denyInvalidCost(b *bucketState, p configfile.CostProblem) *authv3.CheckResponse {
	d := new(deniedReply)
	d.ptrs[0] = header(&d.opts[0], &d.vals[0], "content-type", "application/json")
	d.denied.Status = s.http400
	d.denied.Headers = d.ptrs[:1]
	d.denied.Body = `{"error":"invalid_cost","bucket":` + b.quoted + `,"problem":"` + p.String() + `"}` + "\n"
	d.wrap.DeniedResponse = &d.denied
	d.resp.Status = s.statusBadCost
	d.resp.HttpResponse = &d.wrap
	return &d.resp
}

func (s *Service) denyUnreadable(b *bucketState) *authv3.CheckResponse {
	return s.denyStatus(b, s.statusUnreadable, s.http403, "unreadable_account")
}

// denyStatus is a refusal (403, or 400) of a request the bucket cannot
// count, with the JSON body {"error": code, "bucket": name}.
func (s *Service) denyStatus(b *bucketState, st *rpcstatus.Status, hs *typev3.HttpStatus, code string) *authv3.CheckResponse {
	d := new(deniedReply)
	d.ptrs[0] = header(&d.opts[0], &d.vals[0], "content-type", "application/json")
	d.denied.Status = hs
	d.denied.Headers = d.ptrs[:1]
	d.denied.Body = `{"error":"` + code + `","bucket":` + b.quoted + "}\n"
	d.wrap.DeniedResponse = &d.denied
	d.resp.Status = st
	d.resp.HttpResponse = &d.wrap
	return &d.resp
}

// logLimited writes the debug line of a rejection. The key is in the log
// (debug level only), never in a metric label.
func (s *Service) logLimited(ctx context.Context, msg string, b *bucketState, key string, lim counter.Limit, r counter.Result) {
	if !s.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	s.log.LogAttrs(ctx, slog.LevelDebug, msg,
		slog.String("bucket", b.rule.Name),
		slog.String("key", key),
		slog.Int64("limit", lim.Limit),
		slog.Int64("scale_ms", lim.ScaleMS),
		slog.Int64("retry_after_ms", r.RetryAfterMS),
	)
}

// chargeMeta is the dynamic metadata of a check with buckets charged
// after the response, in one allocation (plus its maps and one string):
// login routes are where floods of password guesses arrive. A bucket with
// several keys (a login presenting several accounts) costs a list more.
type chargeMeta struct {
	outer structpb.Struct
	// keys is the first field of bucket keys (failures or charges); a
	// route with both kinds of buckets allocates the second.
	keys     keyStruct
	keysUsed bool
	strs     [3 + maxApplied]strValue
}

// keyStruct is one field of bucket keys: bucket name → key(s).
type keyStruct struct {
	st   structpb.Struct
	val  structpb.Value
	kind structpb.Value_StructValue
}

type strValue struct {
	v structpb.Value
	k structpb.Value_StringValue
}

func (sv *strValue) set(s string) *structpb.Value {
	sv.k.StringValue = s
	sv.v.Kind = &sv.k
	return &sv.v
}

// chargeMetadata reports who the request was, so that what Envoy reports
// later through its access log is charged to the same keys: each bucket
// charged after the response maps to its key, or to the list of its keys
// when it has several (every account a login presents), under the field
// its cost names (configfile.Cost.Metadata: "failures" for failed logins,
// "charges" for response costs), so that Envoy's access-log filter can
// send failures only when the status is one. A denied request reached no
// upstream and costs nothing: its metadata lists no charges (a failed
// login's keys stay, as a denial is no failure).
func (s *Service) chargeMetadata(g *generation, res match.Result, denied bool) *structpb.Struct {
	strs := copyOf(res)
	m := new(chargeMeta)
	ip := strs.next(len(res.ClientIP))
	account := strs.next(len(res.Account))
	route := ""
	if res.Route >= 0 {
		route = g.routes[res.Route]
	}
	m.outer.Fields = make(map[string]*structpb.Value, 4)
	m.outer.Fields[accesslog.MetaIP] = m.strs[0].set(ip)
	m.outer.Fields[accesslog.MetaAccount] = m.strs[1].set(account)
	m.outer.Fields[accesslog.MetaRoute] = m.strs[2].set(route)
	var fields [2]*structpb.Struct // failures, charges
	for i, d := range res.Descriptors {
		key := strs.next(len(d.Key))
		b := &g.buckets[d.Bucket]
		if !b.rule.Kind.AfterResponse() || (denied && b.rule.Kind != snapshot.Failures) {
			continue
		}
		field := 0 // failures
		if b.rule.Kind != snapshot.Failures {
			field = 1 // charges
		}
		if fields[field] == nil {
			fields[field] = m.newField(b.rule.Cost.Metadata())
		}
		if key == "" {
			continue
		}
		var v *structpb.Value
		if i < maxApplied {
			v = m.strs[3+i].set(key)
		} else {
			v = structpb.NewStringValue(key)
		}
		addKey(fields[field], b.rule.Name, v)
	}
	return &m.outer
}

// requestStrings is one copy of every request-derived string of a
// match.Result, so that metadata does not point into the request, made
// valid UTF-8 so that the response marshals; next takes them in order.
type requestStrings struct {
	all   string
	valid bool
}

// copyOf copies the client IP, the account and each descriptor's key of
// res, in that order.
func copyOf(res match.Result) requestStrings {
	n := len(res.ClientIP) + len(res.Account)
	for _, d := range res.Descriptors {
		n += len(d.Key)
	}
	buf := make([]byte, 0, n)
	buf = append(buf, res.ClientIP...)
	buf = append(buf, res.Account...)
	for _, d := range res.Descriptors {
		buf = append(buf, d.Key...)
	}
	all := string(buf)
	return requestStrings{all: all, valid: utf8.ValidString(all)}
}

// next returns the next l bytes as a string.
func (r *requestStrings) next(l int) string {
	v := r.all[:l]
	r.all = r.all[l:]
	if !r.valid {
		v = strings.ToValidUTF8(v, "\uFFFD")
	}
	return v
}

// newField adds to m's outer Struct a Struct of bucket name → key under
// name (accesslog.MetaFailures or MetaCharges): the first in m's own
// storage, another in one allocation.
func (m *chargeMeta) newField(name string) *structpb.Struct {
	ks := &m.keys
	if m.keysUsed {
		ks = new(keyStruct)
	}
	m.keysUsed = true
	into := &ks.st
	into.Fields = make(map[string]*structpb.Value, 2)
	ks.kind.StructValue = into
	ks.val.Kind = &ks.kind
	m.outer.Fields[name] = &ks.val
	return into
}

// addKey records key v of bucket name in into: a second key of one bucket
// (a login presenting two accounts) makes a list.
func addKey(into *structpb.Struct, name string, v *structpb.Value) {
	prev, seen := into.Fields[name]
	switch {
	case !seen:
		into.Fields[name] = v
	case prev.GetListValue() != nil:
		l := prev.GetListValue()
		l.Values = append(l.Values, v)
	default:
		into.Fields[name] = structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{prev, v}})
	}
}
