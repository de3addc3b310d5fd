package envoyconf

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// QuotaPath is the shipped bootstrap for Envoy's rate limit quota filter
// (envoy.filters.http.rate_limit_quota) streaming to ratelimit-authz's
// RateLimitQuotaService, relative to the repository root. Render renders
// it as it renders Path: the same four shipped addresses, the
// ratelimit_authz cluster's endpoint being the RLQS server.
const QuotaPath = "envoy/ratelimit-quota.yaml"

// quotaMatchers opens the filter's bucket_matchers in QuotaPath; its
// domain is the line before it.
const (
	quotaMatchers = "              bucket_matchers:"
	quotaDomain   = "              domain: "
)

const (
	quotaSettingsType = "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings"
	headerInputType   = "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput"
)

// QuotaBucket is one entry of the filter's bucket_matchers as
// WithQuotaBuckets writes it: requests whose Header equals Exact (or, with
// Exact empty, starts with Prefix) land in the bucket ID builds. Buckets
// are tried in order; the first that matches wins, and a request no bucket
// matches is not limited.
type QuotaBucket struct {
	// Header is the request header matched (":path" and ":method" are
	// headers here); Exact or Prefix its value.
	Header, Exact, Prefix string
	// ID builds the bucket id Envoy reports: each key gets a fixed value
	// or a request header's.
	ID []QuotaIDPart
	// ReportingInterval is the report cadence; Envoy requires at least
	// 100 ms. 0 writes 1 s.
	ReportingInterval time.Duration
	// NoAssignment is no_assignment_behavior's fallback_rate_limit: what
	// Envoy enforces before the first assignment. nil: Envoy's default,
	// allow all.
	NoAssignment *QuotaStrategy
	// Expired is expired_assignment_behavior's fallback_rate_limit; with
	// ReuseLast instead, reuse_last_assignment. ExpiredTimeout is
	// expired_assignment_behavior_timeout (0: unset).
	Expired        *QuotaStrategy
	ReuseLast      bool
	ExpiredTimeout time.Duration
	// DenyStatus (0: Envoy's default, 429), DenyBody and DenyHeaders are
	// the deny_response_settings.
	DenyStatus  int
	DenyBody    string
	DenyHeaders map[string]string
}

// QuotaIDPart is one key of a bucket id: Value when Header is empty, else
// the value of request header Header (custom_value,
// HttpRequestHeaderMatchInput).
type QuotaIDPart struct {
	Key, Value, Header string
}

// QuotaStrategy is a RateLimitStrategy: exactly one of Blanket
// ("ALLOW_ALL" or "DENY_ALL"), PerUnit (requests per Unit: "SECOND",
// "MINUTE", ...) or a token bucket (MaxTokens refilled by TokensPerFill
// every FillInterval).
type QuotaStrategy struct {
	Blanket       string
	PerUnit       uint64
	Unit          string
	MaxTokens     uint32
	TokensPerFill uint32
	FillInterval  time.Duration
}

// JSON is the strategy as RateLimitStrategy's proto JSON.
func (s QuotaStrategy) JSON() (map[string]any, error) {
	n := 0
	out := map[string]any{}
	if s.Blanket != "" {
		n++
		if s.Blanket != "ALLOW_ALL" && s.Blanket != "DENY_ALL" {
			return nil, fmt.Errorf("blanket rule %q: want ALLOW_ALL or DENY_ALL", s.Blanket)
		}
		out["blanket_rule"] = s.Blanket
	}
	if s.Unit != "" {
		n++
		out["requests_per_time_unit"] = map[string]any{"requests_per_time_unit": s.PerUnit, "time_unit": s.Unit}
	}
	if s.MaxTokens > 0 {
		n++
		if s.FillInterval <= 0 {
			return nil, errors.New("token bucket: no fill interval")
		}
		tb := map[string]any{"max_tokens": s.MaxTokens, "fill_interval": duration(s.FillInterval)}
		if s.TokensPerFill > 0 {
			tb["tokens_per_fill"] = s.TokensPerFill
		}
		out["token_bucket"] = tb
	}
	if n != 1 {
		return nil, fmt.Errorf("a strategy sets %d kinds, want exactly one", n)
	}
	return out, nil
}

func (b QuotaBucket) action(i int) (map[string]any, error) {
	id, err := b.bucketID()
	if err != nil {
		return nil, err
	}
	interval := b.ReportingInterval
	if interval == 0 {
		interval = time.Second
	}
	if interval < 100*time.Millisecond {
		return nil, fmt.Errorf("reporting interval %v: Envoy wants at least 100ms", interval)
	}
	s := map[string]any{
		"@type":              quotaSettingsType,
		"bucket_id_builder":  map[string]any{"bucket_id_builder": id},
		"reporting_interval": duration(interval),
	}
	if b.NoAssignment != nil {
		st, err := b.NoAssignment.JSON()
		if err != nil {
			return nil, fmt.Errorf("no_assignment_behavior: %w", err)
		}
		s["no_assignment_behavior"] = map[string]any{"fallback_rate_limit": st}
	}
	if b.Expired != nil || b.ReuseLast || b.ExpiredTimeout > 0 {
		e, err := b.expiredBehavior()
		if err != nil {
			return nil, err
		}
		s["expired_assignment_behavior"] = e
	}
	if b.DenyStatus != 0 || b.DenyBody != "" || len(b.DenyHeaders) > 0 {
		d, err := b.denySettings()
		if err != nil {
			return nil, err
		}
		s["deny_response_settings"] = d
	}
	return map[string]any{"name": fmt.Sprintf("bucket_%d", i), "typed_config": s}, nil
}

// bucketID is the bucket_id_builder's map of b.ID: key → a fixed value
// or a request header's.
func (b QuotaBucket) bucketID() (map[string]any, error) {
	if len(b.ID) == 0 {
		return nil, errors.New("empty bucket id")
	}
	id := map[string]any{}
	for _, p := range b.ID {
		if p.Key == "" {
			return nil, errors.New("bucket id: empty key")
		}
		if _, dup := id[p.Key]; dup {
			return nil, fmt.Errorf("bucket id: key %q twice", p.Key)
		}
		if err := text("bucket id key", p.Key); err != nil {
			return nil, err
		}
		if p.Header == "" {
			if p.Value == "" {
				return nil, fmt.Errorf("bucket id: key %q: no value and no header", p.Key)
			}
			if err := text("bucket id value", p.Value); err != nil {
				return nil, err
			}
			id[p.Key] = map[string]any{"string_value": p.Value}
			continue
		}
		if !headerName.MatchString(p.Header) {
			return nil, fmt.Errorf("bucket id: header %q: want a lowercase header name", p.Header)
		}
		id[p.Key] = map[string]any{"custom_value": map[string]any{
			"name": p.Key, "typed_config": map[string]any{"@type": headerInputType, "header_name": p.Header}}}
	}
	return id, nil
}

// expiredBehavior is the expired_assignment_behavior of b: Expired or
// ReuseLast, not both, and ExpiredTimeout.
func (b QuotaBucket) expiredBehavior() (map[string]any, error) {
	e := map[string]any{}
	if b.Expired != nil && b.ReuseLast {
		return nil, errors.New("expired_assignment_behavior: both a fallback and reuse_last_assignment")
	}
	if b.Expired != nil {
		st, err := b.Expired.JSON()
		if err != nil {
			return nil, fmt.Errorf("expired_assignment_behavior: %w", err)
		}
		e["fallback_rate_limit"] = st
	}
	if b.ReuseLast {
		e["reuse_last_assignment"] = map[string]any{}
	}
	if b.ExpiredTimeout > 0 {
		e["expired_assignment_behavior_timeout"] = duration(b.ExpiredTimeout)
	}
	return e, nil
}

// denySettings is the deny_response_settings of b: DenyStatus, DenyBody
// and DenyHeaders, each only when given.
func (b QuotaBucket) denySettings() (map[string]any, error) {
	d := map[string]any{}
	if b.DenyStatus != 0 {
		if b.DenyStatus < 200 || b.DenyStatus > 599 {
			return nil, fmt.Errorf("deny status %d: want 200-599", b.DenyStatus)
		}
		d["http_status"] = map[string]any{"code": b.DenyStatus}
	}
	if b.DenyBody != "" {
		d["http_body"] = map[string]any{"value": base64.StdEncoding.EncodeToString([]byte(b.DenyBody))}
	}
	var hs []any
	for k, v := range b.DenyHeaders {
		if !headerName.MatchString(k) {
			return nil, fmt.Errorf("deny header %q: want a lowercase header name", k)
		}
		if err := text("deny header value", v); err != nil {
			return nil, err
		}
		hs = append(hs, map[string]any{"header": map[string]any{"key": k, "value": v}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"})
	}
	if len(hs) > 0 {
		d["response_headers_to_add"] = hs
	}
	return d, nil
}

// WithQuotaBuckets returns the rendered quota bootstrap cfg (QuotaPath)
// with the filter's domain and bucket_matchers replaced by domain and bs.
// Everything it writes is JSON, which YAML reads as it is.
func WithQuotaBuckets(cfg []byte, domain string, bs ...QuotaBucket) ([]byte, error) {
	if domain == "" {
		return nil, errors.New("envoyconf: quota filter: empty domain")
	}
	if err := text("domain", domain); err != nil {
		return nil, fmt.Errorf("envoyconf: quota filter: %w", err)
	}
	if len(bs) == 0 {
		return nil, errors.New("envoyconf: quota filter: no bucket")
	}
	var matchers []any
	for i, b := range bs {
		if !headerName.MatchString(b.Header) && b.Header != ":path" && b.Header != ":method" && b.Header != ":authority" {
			return nil, fmt.Errorf("envoyconf: quota bucket %d: header %q: want a lowercase header name", i, b.Header)
		}
		if (b.Exact == "") == (b.Prefix == "") {
			return nil, fmt.Errorf("envoyconf: quota bucket %d: want exactly one of Exact and Prefix", i)
		}
		if err := errors.Join(text("exact", b.Exact), text("prefix", b.Prefix)); err != nil {
			return nil, fmt.Errorf("envoyconf: quota bucket %d: %w", i, err)
		}
		vm := map[string]any{"exact": b.Exact}
		if b.Exact == "" {
			vm = map[string]any{"prefix": b.Prefix}
		}
		act, err := b.action(i)
		if err != nil {
			return nil, fmt.Errorf("envoyconf: quota bucket %d: %w", i, err)
		}
		matchers = append(matchers, map[string]any{
			"predicate": map[string]any{"single_predicate": map[string]any{
				"input":       map[string]any{"name": "header", "typed_config": map[string]any{"@type": headerInputType, "header_name": b.Header}},
				"value_match": vm,
			}},
			"on_match": map[string]any{"action": act},
		})
	}
	m, err := json.Marshal(map[string]any{"matcher_list": map[string]any{"matchers": matchers}})
	if err != nil {
		return nil, fmt.Errorf("envoyconf: quota filter: %w", err)
	}
	s := string(cfg)
	start, end, err := block(s, quotaMatchers)
	if err != nil {
		return nil, err
	}
	s = s[:start] + quotaMatchers + " " + string(m) + "\n" + s[end:]
	dj, _ := json.Marshal(domain)
	s, err = replaceLine(s, quotaDomain, quotaDomain+string(dj))
	if err != nil {
		return nil, err
	}
	return []byte(s), nil
}
