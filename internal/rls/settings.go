package rls

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Settings are the service's global switches, upstream's environment
// settings of the same meaning, fixed when the Service is made (New).
// The zero Settings is upstream's default.
type Settings struct {
	// ShadowMode is upstream's SHADOW_MODE: overall_code is always OK,
	// the statuses still say which descriptors are over.
	ShadowMode bool
	// ResponseHeaders is upstream's LIMIT_RESPONSE_HEADERS_ENABLED: the
	// reply carries the limit, remaining and reset of one descriptor
	// (see the package doc) in three response headers.
	ResponseHeaders bool
	// LimitHeader, RemainingHeader and ResetHeader name them (upstream's
	// LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER);
	// empty: RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset.
	LimitHeader, RemainingHeader, ResetHeader string
	// DenyOverflow answers OVER_LIMIT for a new key the counter cannot
	// track (at its key bound); false: allowed uncounted (OK).
	DenyOverflow bool
}

// Default header names of Settings.
const (
	DefaultLimitHeader     = "RateLimit-Limit"
	DefaultRemainingHeader = "RateLimit-Remaining"
	DefaultResetHeader     = "RateLimit-Reset"
)

// withDefaults fills the header names and checks them: each must be an
// HTTP field name (a token), and the three distinct (in any case: HTTP
// field names are case-insensitive).
func (s Settings) withDefaults() (Settings, error) {
	for _, h := range []struct {
		p   *string
		def string
	}{{&s.LimitHeader, DefaultLimitHeader}, {&s.RemainingHeader, DefaultRemainingHeader}, {&s.ResetHeader, DefaultResetHeader}} {
		if *h.p == "" {
			*h.p = h.def
		}
		if len(*h.p) > maxHeaderName || !httpguts.ValidHeaderFieldName(*h.p) {
			return s, fmt.Errorf("rls: response header name %q: want an HTTP field name (letters, digits and !#$%%&'*+-.^_`|~), at most %d bytes", *h.p, maxHeaderName)
		}
	}
	if equalFold(s.LimitHeader, s.RemainingHeader) || equalFold(s.LimitHeader, s.ResetHeader) || equalFold(s.RemainingHeader, s.ResetHeader) {
		return s, fmt.Errorf("rls: response header names %q, %q and %q must differ", s.LimitHeader, s.RemainingHeader, s.ResetHeader)
	}
	return s, nil
}

const maxHeaderName = 256

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// Options are the fixed parts of a Service: the bounds on what one
// request may carry, and the clock. A zero field takes its default.
type Options struct {
	// Now is the clock; nil means time.Now. Only tests set it.
	Now func() time.Time
	// Leases holds the leases of concurrency rules (*inflight.Sync, the
	// node's, shared with Check and the peers); required when a
	// configuration has one.
	Leases Leases
	// MaxDescriptors bounds the descriptors of one request; default 64.
	// Envoy sends one per matching rate_limits entry of the route, a
	// number its configuration fixes, not the client.
	MaxDescriptors int
	// MaxEntries bounds the entries of one descriptor; default 32 (one
	// per action of the rate_limits entry).
	MaxEntries int
	// MaxKeyBytes bounds an entry's key (Envoy's descriptor_key, from its
	// configuration); default 1 KiB.
	MaxKeyBytes int
	// MaxValueBytes bounds an entry's value; default 64 KiB. A value may
	// be a request header's, which a client chooses: with Envoy's default
	// max_request_headers_kb (60 KiB) no header-borne value reaches the
	// bound. A request over it is refused (InvalidArgument), which Envoy
	// lets through unless its failure_mode_deny is set, so keep the
	// bound above what Envoy admits.
	MaxValueBytes int
}

// Defaults of Options.
const (
	DefaultMaxDescriptors = 64
	DefaultMaxEntries     = 32
	DefaultMaxKeyBytes    = 1 << 10
	DefaultMaxValueBytes  = 64 << 10
)

func (o Options) withDefaults() (Options, error) {
	if o.MaxDescriptors < 0 || o.MaxEntries < 0 || o.MaxKeyBytes < 0 || o.MaxValueBytes < 0 {
		return o, errors.New("rls: request bounds must not be negative")
	}
	def := func(p *int, d int) {
		if *p == 0 {
			*p = d
		}
	}
	def(&o.MaxDescriptors, DefaultMaxDescriptors)
	def(&o.MaxEntries, DefaultMaxEntries)
	def(&o.MaxKeyBytes, DefaultMaxKeyBytes)
	def(&o.MaxValueBytes, DefaultMaxValueBytes)
	if o.Now == nil {
		o.Now = time.Now
	}
	return o, nil
}

// Validate reports what New would refuse in s.
func (s Settings) Validate() error {
	_, err := s.withDefaults()
	return err
}
