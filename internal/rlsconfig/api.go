package rlsconfig

import (
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

// Unit is a rate_limit.unit, numbered as Envoy's
// RateLimitResponse_RateLimit_Unit (1 SECOND … 6 YEAR, 7 WEEK), so a
// conversion to and from the proto enum is a cast.
type Unit int32

// The units of envoyproxy/ratelimit. Month is 30 days and year 365 days,
// counted from the Unix epoch, as upstream.
const (
	Second Unit = 1
	Minute Unit = 2
	Hour   Unit = 3
	Day    Unit = 4
	Month  Unit = 5
	Year   Unit = 6
	Week   Unit = 7
)

// Rule is one configured descriptor that carries a rate_limit.
type Rule struct {
	// Bucket names the rule's counters, unique over every domain of the
	// Config and never a valid ext_authz bucket name: "rls/" + escaped
	// domain + "/" + the escaped composite keys of the matched path,
	// at most 255 bytes (a longer one is "rls/#" + 32 hex digits of its
	// SHA-256). Replication and metrics name the bucket by it.
	Bucket string
	Domain string
	// StatsKey is upstream's stats key built from the configuration
	// (e.g. "test-domain.key1_value1.subkey1", "test-domain.wild_foo*"):
	// bounded by the configuration, never by request values.
	StatsKey string
	// Name is rate_limit.name, returned as current_limit.name.
	Name string
	// RequestsPerUnit is the limit; 0 is legal: every hit is over it.
	RequestsPerUnit uint32
	Unit            Unit
	Unlimited       bool
	Shadow          bool
	// Replaces lists the rate_limit.replaces names.
	Replaces []string
	// Algorithm is the extension rate_limit.algorithm: fixed | sliding;
	// Options.DefaultAlgorithm when absent.
	Algorithm counter.Algorithm
	// Overridable is the extension rate_limit.overridable: tenant
	// overrides apply under the bucket name Name (then a valid ext_authz
	// bucket name, unique among the overridable rules); the tenant is the
	// value of the request descriptor's first entry.
	Overridable bool
	// Charge is the extension rate_limit.charge: the rule's hits are
	// charged, counted whether or not they fit (a cost reported after the
	// request was answered, by Envoy's apply_on_stream_done, which ignores
	// the answer); a hits_addend of 0 still checks without counting.
	Charge bool
	// Concurrency is the extension rate_limit.count: concurrency: the rule
	// limits requests in flight to RequestsPerUnit (no unit). Its
	// descriptor's own entry is the request id (a key without a value, the
	// last of the descriptor): a request-phase call acquires a lease of
	// LeaseTTL for that id, and a call with is_negative_hits releases it.
	// The counter key leaves the request id out.
	Concurrency bool
	LeaseTTL    time.Duration
	// Where the descriptor is written.
	File         string
	Line, Column int
}

// LimitBucket counts the hits of descriptor-supplied limits
// (descriptor.limit) of one domain and unit.
type LimitBucket struct {
	Domain string
	Unit   Unit
	// Bucket is "rls-limit/" + escaped domain + "/" + Unit.String(),
	// at most 255 bytes (a longer one is "rls-limit/#" + 32 hex digits).
	Bucket string
}

// Options change how Parse reads the files.
type Options struct {
	// MergeDomains is upstream's MERGE_DOMAIN_CONFIG: a domain in several
	// files is one domain (a composite key given twice is still a problem).
	MergeDomains bool
	// DefaultAlgorithm counts rules without rate_limit.algorithm.
	DefaultAlgorithm counter.Algorithm
}

// File is one configuration file's name (as problems name it) and content.
type File struct {
	Name string
	Data []byte
}

// Layout is upstream's runtime directory layout.
type Layout struct {
	Root           string // RUNTIME_ROOT
	Subdirectory   string // RUNTIME_SUBDIRECTORY
	AppDirectory   string // RUNTIME_APPDIRECTORY; "" means "config"
	WatchRoot      bool   // RUNTIME_WATCH_ROOT (upstream default true)
	IgnoreDotfiles bool   // RUNTIME_IGNOREDOTFILES
}
