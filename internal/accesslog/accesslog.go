// Package accesslog charges the buckets whose hits are known only from the
// response, from Envoy's gRPC access log (and POST /v1/failures): 1 per
// failure (a failed login) in the buckets whose count is "failures", the
// reported cost (a response header, trailer or body bytes) in the buckets
// whose cost says so (snapshot.Kind.AfterResponse), and it releases the
// leases of the "concurrency" buckets under the request's id. The Check
// peeks (or leases) and records the request's keys in its dynamic metadata
// (the Meta* constants); the access-log entry charges or releases them.
//
// Invariants: a charge only adds, between 0 and the cost's max, under the
// limit the Check peeks at (one resolver); a release frees only the lease
// it names; a charge the counter cannot keep (key table full) is counted,
// never dropped unseen.
//
// Failure mode: bad reports never crash the node — entries without
// metadata, of other routes, with unknown buckets or malformed keys are
// skipped and counted by reason. A Recorder is safe for concurrent use.
//
// The reasoning is in docs/design/after-response.md.
package accesslog

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// The dynamic-metadata contract between the Check, which writes it on
// routes with failure-counting buckets, and the access log, which carries
// it back with the response code.
const (
	// MetadataNamespace is where Envoy files a Check's dynamic metadata.
	MetadataNamespace = "envoy.filters.http.ext_authz"
	MetaIP            = "ip"       // the trusted client IP
	MetaAccount       = "account"  // the normalised login account ("" when none)
	MetaRoute         = "route"    // the route rule's name, or its path template
	MetaFailures      = "failures" // struct: failure-counting bucket name → key, or list of keys (every account a login presents)
	MetaCharges       = "charges"  // struct: response-charged cost bucket name → key, or list of keys
	MetaLeases        = "leases"   // struct: concurrency bucket name → key of the lease the request holds (released by its entry)
)

// metaFields are the metadata fields that name keys to charge, each the
// configfile.Cost.Metadata of the buckets it lists.
var metaFields = [...]string{MetaFailures, MetaCharges}

// maxKeysPerBucket bounds the keys one entry may list for one bucket: the
// Check lists at most match.MaxAccounts accounts and the shared key
// of unreadable ones. A longer list is malformed and counts nothing.
const maxKeysPerBucket = match.MaxAccounts + 1

// maxKeyBytes bounds a key taken from a report; longer ones are refused.
// (The Check's keys are bounded by what Envoy accepts in a header or body.)
const maxKeyBytes = 1024

// Releaser releases a request's lease of a concurrency bucket (by its
// request id), here or, forwarded, at the peer that holds it;
// *inflight.Sync is one.
type Releaser interface {
	Release(bucket counter.Bucket, key, requestID string) bool
}

// Counter charges hits. *counter.Store is one.
type Counter interface {
	Incr(bucket counter.Bucket, key string, lim counter.Limit, n int64, now time.Time) counter.Result
}

var _ Counter = (*counter.Store)(nil)

// Config is what a Recorder needs of the configuration.
type Config struct {
	// Buckets are the rules file's, indexed as the Check's (the matcher's
	// dense indices); reports charge those whose Kind.AfterResponse.
	Buckets []snapshot.Bucket
	// Routes are the route rules, for reports that name one.
	Routes []Route
	// StatusCodes are the response codes that count as failures
	// (required).
	StatusCodes []uint32
	// IPv6Prefix is the prefix length IPv6 clients are keyed by, as the
	// Check keys them.
	IPv6Prefix int
}

// Route is one route rule: a report names it by Name, or an unnamed one by
// Path.
type Route struct {
	Name, Path string
	Buckets    []int // indexes into Config.Buckets
}

// routeIndex returns the first route whose name, or else whose path (of an
// unnamed route), is ref; -1 when none is.
func (c *Config) routeIndex(ref string) int {
	for i := range c.Routes {
		if c.Routes[i].Name == ref {
			return i
		}
	}
	for i := range c.Routes {
		if c.Routes[i].Name == "" && c.Routes[i].Path == ref {
			return i
		}
	}
	return -1
}

// Options are the optional parts of a Recorder.
type Options struct {
	// Token enables POST /v1/failures for requests that carry it as a
	// bearer token; empty disables the endpoint.
	Token string
	// Now is the clock; nil means time.Now. Only tests set it.
	Now func() time.Time
	// Overrides are the tenant overrides Prepare resolves a snapshot's
	// limits over; nil: the configured limits only.
	Overrides limits.Overrides
	// Leases releases the leases an entry names; nil: entries naming
	// leases are malformed.
	Leases Releaser
}

// Recorder counts reported failures. Create it with New; a reload swaps
// its configuration while it serves (Prepare).
type Recorder struct {
	alsv3.UnimplementedAccessLogServiceServer

	gen    atomic.Pointer[generation]
	count  Counter
	leases Releaser // nil: none
	over   limits.Overrides
	log    *slog.Logger
	now    func() time.Time
	token  []byte
	m      *metrics

	// closing ends the long-lived access-log streams at shutdown: gRPC's
	// graceful stop would otherwise wait for Envoy to hang up.
	closing   chan struct{}
	closeOnce sync.Once
}

// generation is one configuration, immutable: a report is counted wholly
// under the one it loaded.
type generation struct {
	cfg     Config
	limits  *snapshot.Resolver
	byName  map[string]int  // bucket name → index
	metrics []bucketMetrics // by index
	// failureBuckets are the buckets with count: failures, in config order.
	failureBuckets []int
}

// family names the metrics of a bucket charged after the response:
// "failures" or "cost" ("" for the others).
func family(b snapshot.Bucket) string {
	switch b.Kind {
	case snapshot.Failures:
		return "failures"
	case snapshot.ResponseCost:
		return "cost"
	}
	return ""
}

// CloseStreams ends every open access-log stream with UNAVAILABLE (Envoy
// reconnects, to another node if this one is going away) and refuses new
// ones. The server calls it before its graceful stop. Idempotent.
func (rec *Recorder) CloseStreams() {
	rec.closeOnce.Do(func() { close(rec.closing) })
}

// New returns a Recorder counting into c under the limits resolved by
// limits. Its metrics go to reg.
func New(cfg Config, c Counter, limits *snapshot.Resolver, reg prometheus.Registerer, log *slog.Logger, opts Options) (*Recorder, error) {
	if c == nil || limits == nil || reg == nil || log == nil {
		return nil, errors.New("failures: New needs a counter, limits, a registerer and a logger")
	}
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	rec := &Recorder{count: c, leases: opts.Leases, over: opts.Overrides, log: log, now: opts.Now, token: []byte(opts.Token), closing: make(chan struct{})}
	if rec.now == nil {
		rec.now = time.Now
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	rec.m = m
	rec.gen.Store(rec.newGeneration(cfg, limits))
	return rec, nil
}

// Prepare validates snap for failure counting, its limits resolved over
// Options.Overrides, and returns what makes it the configuration of the
// next report; it changes nothing itself. A report being counted
// finishes on the previous one.
func (rec *Recorder) Prepare(snap *snapshot.Snapshot) (swap func(), err error) {
	return rec.prepare(ConfigFrom(snap), snapshot.NewResolver(snap, rec.over))
}

func (rec *Recorder) prepare(cfg Config, limits *snapshot.Resolver) (func(), error) {
	if limits == nil {
		return nil, errors.New("failures: the configuration needs limits")
	}
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	g := rec.newGeneration(cfg, limits)
	return func() {
		old := rec.gen.Swap(g)
		// The series of failure buckets the new configuration no longer
		// has go: a renamed bucket must not leave a frozen one behind.
		for _, b := range old.cfg.Buckets {
			was := family(b)
			if i, ok := g.byName[b.Name]; was != "" && (!ok || family(g.cfg.Buckets[i]) != was) {
				rec.m.forget(b.Name, was)
			}
		}
	}, nil
}

// ConfigFrom is failure counting's part of snap: the rules file's
// buckets, routes, failure codes and IPv6 prefix.
func ConfigFrom(snap *snapshot.Snapshot) Config {
	r := snap.Rules
	c := Config{
		Buckets:     snap.RuleBuckets(),
		Routes:      make([]Route, len(r.Routes)),
		StatusCodes: r.Failures.StatusCodes,
		IPv6Prefix:  r.Keys.IPv6Prefix,
	}
	for i, rt := range r.Routes {
		c.Routes[i] = Route{Name: rt.Name, Path: rt.Path, Buckets: rt.Buckets}
	}
	return c
}

func checkConfig(cfg Config) error {
	if len(cfg.StatusCodes) == 0 {
		return errors.New("failures: no status codes count as failures")
	}
	for _, rt := range cfg.Routes {
		for _, b := range rt.Buckets {
			if b < 0 || b >= len(cfg.Buckets) {
				return fmt.Errorf("failures: route %q names bucket %d of %d", rt.Name+rt.Path, b, len(cfg.Buckets))
			}
		}
	}
	return nil
}

func (rec *Recorder) newGeneration(cfg Config, limits *snapshot.Resolver) *generation {
	g := &generation{cfg: cfg, limits: limits, byName: map[string]int{}, metrics: rec.m.forBuckets(cfg.Buckets)}
	for i, b := range cfg.Buckets {
		if _, dup := g.byName[b.Name]; !dup {
			g.byName[b.Name] = i
		}
		if b.Kind == snapshot.Failures {
			g.failureBuckets = append(g.failureBuckets, i)
		}
	}
	return g
}

// isFailure reports whether an HTTP status code counts as a failure.
func (g *generation) isFailure(code uint32) bool {
	return slices.Contains(g.cfg.StatusCodes, code)
}

// record charges n (a failure: 1) to key in bucket b under lim.
// It returns where the key stands afterwards: Allowed false means locked
// out, or the budget spent. A charge the counter cannot keep (its key
// table is full) is counted in refused, never dropped unseen; the check
// then fails closed on the same full table (failure buckets deny on
// overflow by default).
func (rec *Recorder) record(g *generation, b int, key string, lim counter.Limit, n int64, now time.Time) counter.Result {
	after := rec.count.Incr(g.cfg.Buckets[b].ID, key, lim, n, now)
	bm := g.metrics[b]
	if after.Overflow {
		bm.refused.Inc()
		// Debug: the metric is the signal; a flood must not become log volume.
		rec.log.LogAttrs(context.Background(), slog.LevelDebug, "charge not counted: counter key table full",
			slog.String("bucket", g.cfg.Buckets[b].Name), slog.String("key", key))
		return after
	}
	bm.counted.Add(float64(n))
	// This failure began the lockout when it took the count from below
	// the limit to it: one failure adds one to the count (to the rounded-up
	// estimate, for a sliding window).
	if bm.lockouts != nil && !after.Allowed && after.Count-n < lim.Limit {
		bm.lockouts.Inc()
		rec.log.LogAttrs(context.Background(), slog.LevelDebug, "locked out",
			slog.String("bucket", g.cfg.Buckets[b].Name), slog.String("key", key),
			slog.Int64("limit", lim.Limit), slog.Int64("scale_ms", lim.ScaleMS),
			slog.Int64("retry_after_ms", after.RetryAfterMS))
	}
	return after
}

// StreamAccessLogs implements envoy.service.accesslog.v3.AccessLogService.
// Envoy keeps the stream open and sends entries as they come; a broken
// entry is skipped, never fatal to the stream.
func (rec *Recorder) StreamAccessLogs(stream grpc.ClientStreamingServer[alsv3.StreamAccessLogsMessage, alsv3.StreamAccessLogsResponse]) error {
	select {
	case <-rec.closing:
		return status.Error(codes.Unavailable, "shutting down")
	default:
	}
	rec.m.streams.Inc()
	defer rec.m.streams.Dec()
	// Recv blocks; receive in a goroutine so that shutdown can end the
	// stream. Returning ends the RPC, which unblocks that Recv.
	done := make(chan error, 1)
	go func() { done <- rec.receive(stream) }()
	select {
	case err := <-done:
		return err
	case <-rec.closing:
		return status.Error(codes.Unavailable, "shutting down")
	}
}

func (rec *Recorder) receive(stream grpc.ClientStreamingServer[alsv3.StreamAccessLogsMessage, alsv3.StreamAccessLogsResponse]) error {
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&alsv3.StreamAccessLogsResponse{})
		}
		if err != nil {
			return err
		}
		for _, e := range msg.GetHttpLogs().GetLogEntry() {
			rec.m.entries[rec.entry(e)].Inc()
		}
		if n := len(msg.GetTcpLogs().GetLogEntry()); n > 0 {
			rec.m.entries[entryIgnored].Add(float64(n))
		}
	}
}

type entryResult int

const (
	entryCounted   entryResult = iota // charged in at least one bucket
	entryIgnored                      // not a failure, or not a route with buckets charged after the response
	entryMalformed                    // metadata present but unusable
	entryReleased                     // the request's leases released (not a failure)
	numEntryResults
)

var entryResultNames = [numEntryResults]string{"counted", "ignored", "malformed", "released"}

func (rec *Recorder) entry(e *accesslogv3.HTTPAccessLogEntry) entryResult {
	g := rec.gen.Load()
	md := e.GetCommonProperties().GetMetadata().GetFilterMetadata()[MetadataNamespace]
	released := entryIgnored
	if lv, ok := md.GetFields()[MetaLeases]; ok {
		released = rec.releaseLeases(g, lv, e.GetRequest().GetRequestId())
	}
	failure := g.isFailure(e.GetResponse().GetResponseCode().GetValue())
	var now time.Time
	counted, bad := 0, 0
	for _, field := range metaFields {
		fv, ok := md.GetFields()[field]
		if !ok || (field == MetaFailures && !failure) {
			continue // a route without such buckets, or not a failure
		}
		fs := fv.GetStructValue()
		if fs == nil {
			bad++
			continue
		}
		if now.IsZero() {
			now = rec.now()
		}
		for name, v := range fs.GetFields() {
			keys, ok := keyList(v)
			b, known := g.byName[name]
			if !ok || !known || g.cfg.Buckets[b].Cost.Metadata() != field || !g.cfg.Buckets[b].Kind.AfterResponse() {
				bad++
				continue
			}
			n := g.charge(b, e)
			limited := false
			for _, key := range keys.all() {
				lim, ok := g.limits.Limit(b, key)
				if !ok {
					limited = true
					break
				}
				rec.record(g, b, key, lim, n, now)
			}
			if limited {
				bad++
				continue
			}
			counted++
		}
	}
	switch {
	case counted > 0:
		return entryCounted
	case bad > 0:
		return entryMalformed
	}
	return released // no keys to charge: the leases' outcome, if any
}

// releaseLeases releases the leases an entry's metadata names (bucket
// name → key, as the Check recorded them) under the request's id,
// whatever the response: each frees the lease of that request, bucket
// and key only, if this node or a peer holds it.
func (rec *Recorder) releaseLeases(g *generation, lv *structpb.Value, requestID string) entryResult {
	ls := lv.GetStructValue()
	if ls == nil || rec.leases == nil || requestID == "" || len(ls.GetFields()) > len(g.cfg.Buckets) {
		return entryMalformed
	}
	bad := 0
	for name, v := range ls.GetFields() {
		key, ok := stringValue(v)
		b, known := g.byName[name]
		if !ok || !known || g.cfg.Buckets[b].Kind != snapshot.InFlight {
			bad++
			continue
		}
		rec.leases.Release(g.cfg.Buckets[b].ID, key, requestID)
	}
	if bad > 0 {
		return entryMalformed
	}
	return entryReleased
}

// charge is what entry e charges bucket b (configfile.Cost.Response for a
// reported value), its outcome counted; a failure charges 1.
func (g *generation) charge(b int, e *accesslogv3.HTTPAccessLogEntry) int64 {
	c := g.cfg.Buckets[b].Cost
	var (
		n int64
		p configfile.CostProblem
	)
	switch c.Source {
	case configfile.CostFailures:
		return 1
	case configfile.CostResponseBytes:
		if bytes := e.GetResponse().GetResponseBodyBytes(); bytes > uint64(c.Max) {
			n, p = c.Max, configfile.CostOverMax
		} else {
			n = int64(bytes)
		}
	case configfile.CostResponseHeader:
		v, ok := e.GetResponse().GetResponseHeaders()[c.Header]
		n, p = c.Response(v, ok)
	case configfile.CostResponseTrailer:
		v, ok := e.GetResponse().GetResponseTrailers()[c.Header]
		n, p = c.Response(v, ok)
	}
	g.metrics[b].values[p].Inc()
	return n
}

// keys are the keys of one bucket in an entry: one, or a list.
type keys struct {
	one  string
	list []*structpb.Value // checked by keyList
}

func (k keys) all() []string {
	if k.list == nil {
		return []string{k.one}
	}
	out := make([]string, len(k.list))
	for i, v := range k.list {
		out[i] = v.GetStringValue()
	}
	return out
}

// keyList reads a bucket's key, or its non-empty list of at most
// maxKeysPerBucket distinct keys; anything else is malformed as a whole,
// so that a bad report is counted as one, never half applied.
func keyList(v *structpb.Value) (keys, bool) {
	lv := v.GetListValue()
	if lv == nil {
		k, ok := stringValue(v)
		return keys{one: k}, ok
	}
	vals := lv.GetValues()
	if len(vals) == 0 || len(vals) > maxKeysPerBucket {
		return keys{}, false
	}
	for i, x := range vals {
		k, ok := stringValue(x)
		if !ok {
			return keys{}, false
		}
		for _, y := range vals[:i] {
			if y.GetStringValue() == k {
				return keys{}, false
			}
		}
	}
	return keys{list: vals}, true
}

func stringValue(v *structpb.Value) (string, bool) {
	sv, ok := v.GetKind().(*structpb.Value_StringValue)
	if !ok || sv.StringValue == "" || len(sv.StringValue) > maxKeyBytes || !utf8.ValidString(sv.StringValue) {
		return "", false
	}
	return sv.StringValue, true
}

// Report is the body of POST /v1/failures.
type Report struct {
	IP      string `json:"ip"`
	Account string `json:"account"`
	// Route optionally names the route rule (or its path) whose failure
	// buckets count; without it every failure bucket keyed by IP or
	// account counts.
	Route string `json:"route,omitempty"`
}

// ReportResult tells the reporter where each bucket now stands.
type ReportResult struct {
	Counted map[string]BucketState `json:"counted"`
}

// BucketState is one bucket after a report.
type BucketState struct {
	Key    string `json:"key"`
	Count  int64  `json:"count"`
	Limit  int64  `json:"limit"`
	Locked bool   `json:"locked"`
	// Refused: the counter's key table is full and could not keep this
	// failure (counted in failures_refused_total); checks of the key fail
	// closed meanwhile.
	Refused      bool  `json:"refused,omitempty"`
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}

// ServeHTTP serves POST /v1/failures.
func (rec *Recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if len(rec.token) == 0 {
		rec.reject(w, http.StatusNotFound, "disabled", "failure reports over HTTP are disabled: set RATELIMIT_AUTHZ_FAILURES_TOKEN")
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		rec.reject(w, http.StatusMethodNotAllowed, "bad_request", "use POST")
		return
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(got), rec.token) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="ratelimit-authz"`)
		rec.reject(w, http.StatusUnauthorized, "unauthorized", "a valid bearer token is required")
		return
	}
	var rep Report
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		rec.reject(w, http.StatusBadRequest, "bad_request", "body must be JSON {\"ip\": …, \"account\": …, \"route\": …}: "+err.Error())
		return
	}
	res, err := rec.Report(rep)
	if err != nil {
		rec.reject(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	rec.m.reports[reportCounted].Inc()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(res)
}

func (rec *Recorder) reject(w http.ResponseWriter, code int, result reportResult, msg string) {
	rec.m.reports[result].Inc()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// Report counts one failure described by rep, validated as a Check would
// see it: the IP canonical, the account trimmed and lower-cased.
func (rec *Recorder) Report(rep Report) (ReportResult, error) {
	// Keyed as a check keys it: IPv6 by its network.
	g := rec.gen.Load()
	ip, ok := match.IPKey(rep.IP, g.cfg.IPv6Prefix)
	if !ok {
		return ReportResult{}, fmt.Errorf("ip %q is not an IP address", rep.IP)
	}
	account := ""
	if rep.Account != "" {
		if len(rep.Account) > maxKeyBytes {
			return ReportResult{}, fmt.Errorf("account is longer than %d bytes", maxKeyBytes)
		}
		if account = match.NormalizeAccount(rep.Account); account == "" {
			return ReportResult{}, errors.New("account must be valid UTF-8 text")
		}
	}
	buckets := g.failureBuckets
	if rep.Route != "" {
		route := g.cfg.routeIndex(rep.Route)
		if route < 0 {
			return ReportResult{}, fmt.Errorf("route %q is not in the configuration", rep.Route)
		}
		buckets = nil
		for _, b := range g.cfg.Routes[route].Buckets {
			if g.cfg.Buckets[b].Kind == snapshot.Failures {
				buckets = append(buckets, int(b))
			}
		}
	}
	now := rec.now()
	res := ReportResult{Counted: map[string]BucketState{}}
	for _, b := range buckets {
		var key string
		switch g.cfg.Buckets[b].Key.Kind {
		case match.KeyIP:
			key = ip
		case match.KeyAccount:
			key = account
		}
		if key == "" {
			continue // keyed by something a report does not carry, or no account
		}
		lim, ok := g.limits.Limit(b, key)
		if !ok {
			continue
		}
		st := rec.record(g, b, key, lim, 1, now)
		res.Counted[g.cfg.Buckets[b].Name] = BucketState{
			Key: key, Count: st.Count, Limit: lim.Limit, Locked: !st.Allowed, RetryAfterMS: st.RetryAfterMS,
			Refused: st.Overflow,
		}
	}
	if len(res.Counted) == 0 {
		return res, errors.New("no failure bucket applies to this report")
	}
	return res, nil
}
